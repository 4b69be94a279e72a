"""Q4_K repacked into 8 interleaved rows against the engine's Q4_K GEMV, 1 to 8 activation rows (AVX-512 VNNI).

    python -m bench.tools.q4k_interleaved

Builds `q4k_interleaved.c` beside this file with the engine's flags for this CPU (it includes quant_linear.c whole)
and runs it on 2 threads: 24 distinct [2048, 8192] Q4_K matrices (Llama-3.2-1B's down projection, 9.4 MB each)
streamed from memory, the fastest of 7 passes, GB/s of weights read. It measures the layout issue #36 leaves to
build; the engine does not use it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.native.build import CFLAGS, INCLUDE_DIR

SOURCE = Path(__file__).with_name("q4k_interleaved.c")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "q4k_interleaved"
        flags = [f for f in CFLAGS if f not in ("-shared", "-fPIC")]
        subprocess.run(
            ["cc", *flags, "-march=native", f"-I{INCLUDE_DIR}", str(SOURCE), "-o", str(binary), "-lm"],
            check=True,
        )
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
        sys.exit(subprocess.run([str(binary)], env=env, check=False).returncode)


if __name__ == "__main__":
    main()
