"""`pagedchat bench attention`: the CPU decode-attention kernel's bandwidth against the machine's streaming read."""
