"""``jupyter_mn.checkpoint``, the path users import: the same module as ``rank/checkpoint.py``
(the code runs in the ranks), so what one patches or reads the other sees."""

import sys

from .rank import checkpoint

sys.modules[__name__] = checkpoint
