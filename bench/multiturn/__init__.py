"""`pagedchat bench multiturn`: N users x K turns sharing a system prompt; its scenarios dispatch to bench.returning and bench.replicas."""
