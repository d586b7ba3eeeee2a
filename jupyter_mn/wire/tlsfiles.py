"""The gang's TLS files as the kernel hands them to its nodes (a Kubernetes secret's keys, the
files of a Slurm job's directory) and the address a node's scheduler is reached at: what both
sides agree on, without the dask the node side serves them with."""

from __future__ import annotations

#: The gang's certificate files: CA, certificate, key (PEM).
TLS_FILES = ("ca.crt", "tls.crt", "tls.key")
#: the environment variable naming the directory of the gang's certificate files (Slurm)
TLS_DIR_VAR = "JUPYTER_MN_TLS_DIR"


def tls_address(host: str, port: int) -> str:
    """``tls://10.0.0.5:8786``, or ``tls://[fd00::5]:8786`` for an IPv6 address."""
    return f"tls://[{host}]:{port}" if ":" in host else f"tls://{host}:{port}"
