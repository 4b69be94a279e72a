"""`pagedchat bench throughput`: offline tokens/s of pagedchat against HF transformers on the same requests."""
