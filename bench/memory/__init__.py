"""`pagedchat bench memory`: paged KV slots against contiguous max-length reservation."""
