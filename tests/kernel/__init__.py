"""The kernel side: magics, specs, Cluster, results, the hang verdict."""
