"""Attention over the paged KV cache: step metadata, the backend protocol, the torch (CPU) and Triton backends."""
