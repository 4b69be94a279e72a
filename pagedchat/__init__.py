"""The `pagedchat` command: one entry point above the engine, the service and the benchmarks."""
