#!/usr/bin/env bash
# One-command GPU check for one CUDA GPU (an H200 in about 4 minutes), run from anywhere:
#   bash scripts/gpu_check.sh          # log also written to $OUT/gpu_check.log (and $OUT/kernel_bench.json) if OUT is set
# 1. the kernel tests compiled natively (pytest -m cuda: fp32 with tf32 dots, and bf16)
# 2. kernel microbenchmarks: decode GB/s vs HBM peak, prefill TFLOP/s, tile sweeps; prints the DECODE TARGET line;
#    then decode over an int8 KV cache (GB/s counting int8 values and their fp16 scales)
# 3. engine throughput on a Llama-shaped ~1B model with random weights, and triton-vs-torch greedy agreement
# Each part has its own time limit and runs even if an earlier one failed; the exit status is 1 if any failed.
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # the cuda tests and benchmarks need compiled kernels
PYTHON="${PYTHON:-python}"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/gpu_check.log") 2>&1
fi

status=0
part() {  # part NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "=== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start))s"
    [ "$rc" -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true
"$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
part "1 kernel tests (native CUDA)" 90 "$PYTHON" -m pytest -q -rs -m cuda tests/kernels -p no:cacheprovider
part "2 kernel microbenchmarks" 80 "$PYTHON" -m bench.tools.kernel_bench --sweep ${OUT:+--json "$OUT/kernel_bench.json"}
part "2b int8 KV decode microbenchmark" 40 "$PYTHON" -m bench.tools.kernel_bench --kv-cache-dtype int8 ${OUT:+--json "$OUT/kernel_bench_int8.json"}
part "3 engine throughput" 70 "$PYTHON" scripts/gpu_check.py
echo "=== gpu_check: $([ "$status" -eq 0 ] && echo ALL PASSED || echo SOME PART FAILED) in ${SECONDS}s"
exit "$status"
