#!/usr/bin/env bash
# Session 33's device runs (issue 32's batch-64 step: the qkv product's scales applied by the
# rotary kernel; the decode attention kernel's settings), one step per call:
#     bash docs/results/device/session33.sh first|check|profile|tests
# Writes under $OUT (the device tool's folder; ./out elsewhere). Needs the wheels in .whl/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
source .whl/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
bench_fp8() {  # $1: the JSON's name; bf16 beside FP8 in one run
    timeout "$2" python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda \
        --dtype fp8 --batch-sizes 1,2,4,8,16,32,64 --context-lens 512 --no-hf > "$OUT/$1.json" 2> "$OUT/$1.err"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['device_name'], d['fp8_over_dense'], d['dense']['decode_graph_ms'], d['fp8']['decode_graph_ms'])" \
        "$OUT/$1.json" 2>&1 | tail -2
}
case "$1" in
first)
    # the qkv-scale tests (and the backends' after the decode launch moved), the sweep, the bench
    timeout 130 python3 -m pytest tests/gpu/test_cuda_fp8.py tests/gpu/test_attention_backends.py \
        -m gpu -q -x -p no:cacheprovider --confcutdir=tests/gpu > "$OUT/test_first.log" 2>&1
    echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/test_first.log" | tail -4
    timeout 220 python3 docs/results/decode_attention_sweep.py > "$OUT/decode_attention_sweep.log" 2>&1
    echo "sweep rc=$?"; cut -c1-700 "$OUT/decode_attention_sweep.log" | tail -8
    bench_fp8 bench_engine_fp8_qkv 170
    ;;
check)
    # after the decode settings changed: the tests that run attention, bench engine twice
    timeout 200 python3 -m pytest tests/gpu/test_cuda_fp8.py tests/gpu/test_attention_backends.py \
        tests/gpu/test_cuda_no_compiles.py tests/gpu/test_cuda_mixed_graphs.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu > "$OUT/test_check.log" 2>&1
    echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/test_check.log" | tail -4
    bench_fp8 bench_engine_fp8_run1 170
    bench_fp8 bench_engine_fp8_run2 170
    ;;
profile|tests)
    # the simulator's H200 FP8 profile again; make test-gpu in two halves: session 32's steps
    exec bash docs/results/device/session32.sh "$1"
    ;;
esac
