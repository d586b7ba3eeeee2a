"""The extension the jupyter_mn kernel spec loads at start.

It registers the same magics as ``jupyter_mn`` under another name, so that a notebook's own
``%load_ext jupyter_mn`` (kept so that the notebook runs in any kernel) loads quietly instead of
printing IPython's "The jupyter_mn extension is already loaded". Loading twice is harmless:
magics register again and the shutdown wrap is applied once.
"""

from .magics import load_ipython_extension

__all__ = ["load_ipython_extension"]
