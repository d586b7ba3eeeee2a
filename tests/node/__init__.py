"""The node agent: rank processes, their template, pipes, GPUs, transports."""
