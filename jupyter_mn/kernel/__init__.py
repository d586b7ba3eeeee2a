"""The notebook kernel's side: the magics and the ``Cluster`` API, the spec a gang is made
from, a cell's payload and result, and the hang verdict."""
