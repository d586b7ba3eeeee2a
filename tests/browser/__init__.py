"""A real JupyterLab server, and a real browser driving it."""
