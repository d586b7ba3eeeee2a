"""The job registry, its logs and the jupyter mn CLI."""
