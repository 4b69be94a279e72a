"""A server process's memory as the kernel counts it: resident bytes now and at their peak (/proc/PID/status), for
benchmarks that put pagedchat's memory beside a baseline's (`bench serving --baseline-pid`)."""

from __future__ import annotations

from pathlib import Path

FIELDS = {"VmRSS": "rss_bytes", "VmHWM": "peak_rss_bytes"}  # resident now; the high-water mark since start


def process_memory(pid: int) -> dict[str, int] | None:
    """{"rss_bytes", "peak_rss_bytes"} of process `pid`, or None when it is gone or not readable (not Linux)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in FIELDS:
            number, unit = value.split()
            assert unit == "kB", f"/proc/{pid}/status gives {key} in {unit}"
            out[FIELDS[key]] = int(number) * 1024
    return out if len(out) == len(FIELDS) else None
