"""A Kubernetes control plane for the tests: an emulated API server (kmock) and controllers, or
the real binaries (``real.py``), with our process kubelet."""
