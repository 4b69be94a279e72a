"""`pagedchat bench …`: throughput, memory, serving and multi-turn benchmarks, each against its baseline."""
