"""One-off measurements the README and the code quote, each runnable from a checkout as `python -m bench.tools.NAME`."""
