#!/usr/bin/env bash
# Session 32's device runs (issue 32: the FP8 GEMV launched early, the many-row SiLU
# quantization), one step per call:   bash docs/results/device/session32.sh fp8|prefill|check|profile|qkv|tests
# Writes under $OUT (the device tool's folder; ./out elsewhere). Needs the wheels in .whl/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
source .whl/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
case "$1" in
fp8)
    timeout 150 python3 -m pytest tests/gpu/test_cuda_fp8.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu > "$OUT/test_cuda_fp8.log" 2>&1
    tail -3 "$OUT/test_cuda_fp8.log"
    timeout 260 python3 docs/results/fp8_pdl.py > "$OUT/fp8_pdl.log" 2>&1
    echo "pdl rc=$?"; cut -c1-400 "$OUT/fp8_pdl.log" | tail -8
    ;;
check)
    # after: fast accumulation on for prefill; the FP8 tests and bench engine twice
    timeout 150 python3 -m pytest tests/gpu/test_cuda_fp8.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu > "$OUT/test_cuda_fp8.log" 2>&1
    tail -3 "$OUT/test_cuda_fp8.log"
    for run in 1 2; do
        timeout 150 python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda \
            --dtype fp8 --batch-sizes 1,2,4,8,16,32,64 --context-lens 512 --no-hf \
            > "$OUT/bench_engine_fp8_run$run.json" 2> "$OUT/bench_engine_fp8_run$run.err"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['fp8_over_dense'], d['dense']['prefill_ms'], d['fp8']['prefill_ms'])" \
            "$OUT/bench_engine_fp8_run$run.json" 2>&1 | tail -2
    done
    ;;
prefill)
    timeout 240 python3 docs/results/fp8_fast_accum.py > "$OUT/fp8_fast_accum.log" 2>&1
    echo "fast_accum rc=$?"; cut -c1-600 "$OUT/fp8_fast_accum.log" | tail -9
    timeout 150 python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda \
        --dtype fp8 --batch-sizes 1,64 --context-lens 512 --no-hf > "$OUT/bench_engine_fp8.json" 2>/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['fp8_over_dense'], d['dense']['prefill_ms'], d['fp8']['prefill_ms'])" \
        "$OUT/bench_engine_fp8.json" 2>&1 | tail -2
    ;;
profile)
    # the simulator's H200 FP8 profile again (PDL GEMV, fast-accumulation prefill)
    grep -q H200 "$OUT/gpu.txt" || { echo "not an H200: no profile"; exit 0; }
    timeout 280 python3 -m blitzscale.cli.main profile --model random:llama3-8b:fp8 --device cuda \
        --batches 1,8,32,64,128 --contexts 128,512,2048 --prefill 128,512,1024,2048,4096 \
        --out "$OUT/profile_llama3-8b-fp8.json" > "$OUT/profile_llama3-8b-fp8.log" 2>&1
    echo "rc=$?"; tail -2 "$OUT/profile_llama3-8b-fp8.log"
    ;;
qkv)
    # the qkv product's scales applied by the rotary kernel (steps of 2-64 rows)
    timeout 200 python3 -m pytest tests/gpu/test_cuda_fp8.py tests/gpu/test_attention_backends.py \
        tests/gpu/test_cuda_no_compiles.py tests/gpu/test_cuda_mixed_graphs.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu > "$OUT/test_qkv.log" 2>&1
    echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/test_qkv.log" | tail -4
    timeout 200 python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda \
        --dtype fp8 --batch-sizes 1,2,4,8,16,32,64 --context-lens 512 --no-hf > "$OUT/bench_engine_fp8_qkv.json" 2>/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['device_name'], d['fp8_over_dense'], d['dense']['decode_graph_ms'], d['fp8']['decode_graph_ms'])" \
        "$OUT/bench_engine_fp8_qkv.json" 2>&1 | tail -2
    ;;
tests)
    # make test-gpu in its two halves (Makefile: GPU_TESTS), one 600 s call
    timeout 190 make test-gpu GPU_TESTS="tests/gpu/test_[a-b]*.py tests/gpu/test_cuda_[a-m]*.py" \
        > "$OUT/test_gpu_a.log" 2>&1
    echo "a rc=$?"; grep -E "passed|failed|error" "$OUT/test_gpu_a.log" | tail -3
    timeout 390 make test-gpu GPU_TESTS="tests/gpu/test_cuda_[n-z]*.py" > "$OUT/test_gpu_b.log" 2>&1
    echo "b rc=$?"; grep -E "passed|failed|error" "$OUT/test_gpu_b.log" | tail -3
    ;;
esac
