"""One-off measurements the README and the code quote, each run from a checkout as `python -m bench.tools.NAME`."""
