#!/usr/bin/env bash
# Session 29's device runs (piecewise graphs of mixed steps), one step per call:
#   bash docs/results/device/session29.sh tests|bench
# Writes under $OUT (the device tool's folder; ./out elsewhere). Needs the wheels in .whl/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
source .whl/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
case "$1" in
tests)
    set -o pipefail
    timeout "${LIMIT:-280}" python3 -m pytest tests/gpu/test_cuda_mixed_graphs.py tests/gpu/test_cuda_prefill_graphs.py \
        tests/gpu/test_cuda_no_compiles.py tests/gpu/test_cuda_overlap.py tests/gpu/test_cuda_fp8.py \
        tests/gpu/test_cuda_engine.py tests/gpu/test_cuda_live.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu 2>&1 | tee "$OUT/test_gpu_mixed.log" | tail -30
    ;;
bench)
    timeout "${LIMIT:-300}" python3 docs/results/mixed_graphs_bench.py 2>&1 | tee "$OUT/mixed_graphs_bench.log" | tail -20
    ;;
esac
