"""`pagedchat bench speculative`."""
