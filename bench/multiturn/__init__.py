"""`pagedchat bench multiturn`: N users x K turns sharing a system prompt; its scenarios run bench/returning/ and
bench/replicas/."""
