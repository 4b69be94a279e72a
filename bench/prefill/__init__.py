"""`pagedchat bench prefill`: the serving prompts prefilled offline, split into matmuls, attention and the rest."""
