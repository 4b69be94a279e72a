"""What every benchmark shares: the results folder, JSON + PNG writing, tables, targets, percentiles, progress."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.core.config import EngineConfig

RESULTS_DIR_ENV = "PAGEDCHAT_RESULTS_DIR"
DEFAULT_RESULTS_DIR = "results"


def results_dir(path: str | Path | None = None) -> Path:
    """The folder results go to: `path`, else $PAGEDCHAT_RESULTS_DIR, else ./results; created if missing."""
    chosen = Path(path or os.environ.get(RESULTS_DIR_ENV) or DEFAULT_RESULTS_DIR).expanduser()
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen


def timestamp(now: _dt.datetime | None = None) -> str:
    """A file-name-safe local timestamp such as 20261130-142501."""
    return (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")


def machine_info() -> dict[str, Any]:
    """The machine a result was measured on: CPU model and cores, GPU if any, library versions."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "num_cpus": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # the HTTP benchmarks can run from a client-only environment
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass(frozen=True)
class Target:
    """A claim checked by a benchmark: `measured` compared with `threshold` (`>=` or `<=`)."""

    name: str
    measured: float
    threshold: float
    op: str = ">="

    @property
    def passed(self) -> bool:
        if math.isnan(self.measured):
            return False
        return self.measured >= self.threshold if self.op == ">=" else self.measured <= self.threshold

    def line(self) -> str:
        """`PASS  name: 2.31 (target >= 2)` style line."""
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict}  {self.name}: {_fmt(self.measured)} (target {self.op} {_fmt(self.threshold)})"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table; numbers are right-aligned and floats shown with sensible precision."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(row[i], (int, float)) for row in rows) if rows else False for i in range(len(headers))
    ]

    def render(row: list[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([render(cells[0]), sep] + [render(r) for r in cells[1:]])


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "n/a"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}" if value.is_integer() or abs(value) >= 1000 else f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def percentiles(values: Sequence[float], ps: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} with linear interpolation; NaN for an empty list."""
    if not values:
        return {f"p{p}": float("nan") for p in ps}
    ordered = sorted(values)
    out = {}
    for p in ps:
        rank = (len(ordered) - 1) * p / 100
        lo = math.floor(rank)
        hi = min(lo + 1, len(ordered) - 1)
        out[f"p{p}"] = ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)
    return out


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for an empty list."""
    return sum(values) / len(values) if values else float("nan")


def progress(total: int | None, desc: str, unit: str = "req"):
    """A tqdm progress bar on stderr, shown also when stderr is a log file (then updated at most once a second)."""
    from tqdm.auto import tqdm

    interval = 0.1 if sys.stderr.isatty() else 1.0
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=interval, dynamic_ncols=True)


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.0, 4.2)):
    """A matplotlib figure on the Agg backend (no display needed) and its axes, flattened to a list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def write_results(
    name: str, payload: dict[str, Any], fig: Any, out_dir: str | Path | None = None, command: str = ""
) -> tuple[Path, Path]:
    """Write results/<name>-<timestamp>.json (payload + machine + command) and the PNG of `fig`; returns both paths."""
    import matplotlib.pyplot as plt

    folder = results_dir(out_dir)
    stamp = timestamp()
    json_path, png_path = folder / f"{name}-{stamp}.json", folder / f"{name}-{stamp}.png"
    document = {
        "benchmark": name,
        "timestamp": stamp,
        "command": command,
        "machine": machine_info(),
        **payload,
    }
    json_path.write_text(
        json.dumps(_finite(document), indent=2, default=_json_default, allow_nan=False) + "\n"
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path


def _finite(value: Any) -> Any:
    """The document with NaN and infinities replaced by null, so that any JSON reader accepts it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def targets_payload(targets: Sequence[Target]) -> list[dict[str, Any]]:
    """Targets as JSON rows: name, measured, op, threshold, passed."""
    return [
        {"name": t.name, "measured": t.measured, "op": t.op, "threshold": t.threshold, "passed": t.passed}
        for t in targets
    ]


def print_report(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    targets: Sequence[Target] = (),
    paths: Sequence[Path] = (),
) -> None:
    """Print a titled table, the PASS/FAIL target lines and where the files went."""
    print(f"\n== {title} ==")
    print(format_table(headers, rows))
    for target in targets:
        print(target.line())
    for path in paths:
        print(f"wrote {path}")


def parse_kv_dtypes(text: str) -> list[str]:
    """KV cache dtypes of a comma-separated list; unknown names are an argparse error."""
    from engine.core.config import KV_CACHE_DTYPES

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in KV_CACHE_DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"KV cache dtypes {unknown or text!r}; choose from {list(KV_CACHE_DTYPES)}"
        )
    return names


def kv_run_name(kv_cache_dtype: str) -> str:
    """The system name of a pagedchat run: plain for the model's dtype, suffixed for int8."""
    return "pagedchat" if kv_cache_dtype == "auto" else f"pagedchat-{kv_cache_dtype}kv"


def positive_ints(text: str) -> list[int]:
    """Comma-separated positive whole numbers (an argparse type)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, got {text!r}")
    return values


def without_disk_tier(config: EngineConfig) -> EngineConfig:
    """An in-process benchmark's engine: no KV disk tier unless --kv-disk-dir names one (a run would otherwise find
    the blocks of its own earlier runs in ~/.cache/pagedchat/kv and report them as prefix hits)."""
    return config if config.kv_disk_dir else dataclasses.replace(config, kv_disk_bytes=0)
