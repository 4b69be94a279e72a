"""Build and load the engine's small C libraries for the CPU, once per machine (cc -O3 -march=native, OpenMP).

A library is compiled on first use into ~/.cache/pagedchat/kernels (or $PAGEDCHAT_CACHE_DIR/kernels) under a name
that hashes its source, the flags, the compiler and this CPU's instruction set, then loaded with ctypes. OpenMP binds
to the libgomp torch has already loaded (same soname), so a library's parallel regions run on torch's own threads.
Without a compiler, or with PAGEDCHAT_NATIVE=0, `load_library` returns None and callers use their torch paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from filelock import FileLock

from engine.core.paths import cache_dir

logger = logging.getLogger(__name__)

CFLAGS = ("-O3", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")  # and -march: this CPU unless a test asks
INCLUDE_DIR = Path(__file__).parent  # the shared headers (simd.h) every library may include
DISABLE_ENV = "PAGEDCHAT_NATIVE"  # "0": never build or load native libraries

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
# a library's key, once per process: hashing the sources and every header again at each of a model's ~140 linears
# took 0.86 s of a 135M model's 1.9 s load (every model loaded on demand pays it, app/http/model_registry.py)
_keys: dict[tuple[Path, str], str] = {}


def load_library(source: Path, march: str = "native") -> ctypes.CDLL | None:
    """The compiled `source` for this machine, built on first use; None when disabled or it cannot be built.

    `march`: the instruction set to compile for; tests build "x86-64-v3" (AVX2, no AVX-512) and "x86-64" (no SIMD
    paths) to run the other machine kinds' code paths on this CPU."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    with _lock:
        if (source, march) not in _keys:
            _keys[(source, march)] = f"{source.stem}_{_build_key(source, march)}"
        key = _keys[(source, march)]
        if key not in _loaded:
            _loaded[key] = _build_and_load(source, key, march)
        return _loaded[key]


def _build_key(source: Path, march: str) -> str:
    """Hash of everything the binary depends on: source, shared headers, flags, compiler, this CPU's instruction set."""
    digest = hashlib.sha256(source.read_bytes() if source.exists() else b"")
    for part in sorted(
        INCLUDE_DIR.rglob("*.h")
    ):  # the shared headers and the sources' included parts (quant/)
        digest.update(part.read_bytes())
    digest.update(" ".join((_compiler() or "", *CFLAGS, march, platform.machine(), _cpu_flags())).encode())
    return digest.hexdigest()[:16]


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _build_and_load(source: Path, key: str, march: str) -> ctypes.CDLL | None:
    compiler = _compiler()
    if not source.exists() or compiler is None:
        logger.info("%s: no %s; using the torch path", source.name, "source" if compiler else "C compiler")
        return None
    target = cache_dir() / "kernels" / f"{key}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # one builder per library across processes (as provision.py's for models): processes that start
            # together on a machine without it (servers, test workers) compile it once and the others load it,
            # instead of each spending the ~7 s quant_linear.c takes on 2 cores at once
            with FileLock(str(target) + ".lock"):
                if not target.exists():  # another process built it while this one waited
                    _compile(compiler, source, march, target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        logger.warning("%s could not be built (%s); using the torch path", source.name, detail)
        return None


def _compile(compiler: str, source: Path, march: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        cmd = [compiler, *CFLAGS, f"-march={march}", f"-I{INCLUDE_DIR}", str(source), "-o", str(built), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        os.replace(built, target)  # atomic: a reader never sees a part-written library
    logger.info("built %s", target)
