"""Gangs: the run loop, faults, preemption, files on the nodes, scale."""
