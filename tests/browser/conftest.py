"""The Lab server and browser fixtures (``tests/support/lab.py``) for the tests in this folder."""

from tests.support.lab import browser, lab, notebook7, page

__all__ = ["browser", "lab", "notebook7", "page"]
