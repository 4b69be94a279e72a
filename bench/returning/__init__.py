"""`pagedchat bench multiturn --scenario returning`: users who come back after their KV blocks left the RAM pool."""
