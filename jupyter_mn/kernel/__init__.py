"""The notebook kernel's side: the magics and the ``Cluster`` API, a cell's payload and its
views, background cells and the job record."""
