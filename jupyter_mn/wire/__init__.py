"""The messages every process shares: the kernel, the node agents and the ranks import
these leaves, and nothing of each other's side."""
