"""What every benchmark shares: servers as subprocesses, the load generator, workloads, HTTP clients, reports."""
