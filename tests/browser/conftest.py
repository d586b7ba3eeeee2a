"""The Lab server and browser fixtures (``tests/support/lab.py``) for the tests in this folder."""

from tests.support.lab import browser, lab, page

__all__ = ["browser", "lab", "page"]
