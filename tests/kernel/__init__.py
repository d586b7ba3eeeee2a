"""The kernel side: magics, the Cluster API, cells, the doctor, frameworks."""
