"""Prometheus metrics of one app: request latencies, the engine's gauges and counters, and a replica set's."""
