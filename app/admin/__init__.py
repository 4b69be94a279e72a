"""Operating the server: /health, /metrics, the admin page's live feed of the block pool, and plain-words advice."""
