"""The package's version, in a leaf module: the agents and the doctor compare it across nodes,
and importing it must not import the package's front (``jupyter_mn/__init__``)."""

__version__ = "0.1.0"
