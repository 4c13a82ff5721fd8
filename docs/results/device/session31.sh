#!/usr/bin/env bash
# Session 31's device runs (the FP8 GEMV widening by moving bits), one step per call:
#   bash docs/results/device/session31.sh fp8|profiles|silu
# Writes under $OUT (the device tool's folder; ./out elsewhere). Needs the wheels in .whl/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
source .whl/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
case "$1" in
fp8)
    timeout 200 python3 docs/results/fp8_gemv_bits.py 2>&1 | tee "$OUT/fp8_gemv_bits.log" | tail -4
    timeout 120 python3 -m pytest tests/gpu/test_cuda_fp8.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu 2>&1 | tee "$OUT/test_cuda_fp8.log" | tail -4
    for run in 1 2; do
        timeout 200 python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda \
            --dtype fp8 --batch-sizes 1,2,4,8,16,32,64 --context-lens 512 --no-hf \
            > "$OUT/bench_engine_fp8_run$run.json" 2> "$OUT/bench_engine_fp8_run$run.err"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['fp8_over_dense'])" \
            "$OUT/bench_engine_fp8_run$run.json" 2>&1 | tail -3
    done
    ;;
silu)
    # one program a row for the FP8 SiLU's quantization of many rows (prefill)
    timeout 120 python3 -m pytest tests/gpu/test_cuda_fp8.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu 2>&1 | tail -2
    timeout 90 python3 docs/results/fp8_silu_rows.py 2>&1 | tail -12
    for run in 1 2; do
        timeout 200 python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda \
            --dtype fp8 --batch-sizes 1,64 --context-lens 512 --no-hf > "$OUT/bench_engine_fp8_silu_run$run.json" 2>/dev/null
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['fp8_over_dense'], d['dense']['prefill_ms'], d['fp8']['prefill_ms'])" \
            "$OUT/bench_engine_fp8_silu_run$run.json" 2>&1 | tail -2
    done
    timeout 100 python3 docs/results/fp8_step_kernels.py prefill 2>&1 | cut -c1-300 | tail -4
    ;;
profiles)
    # the simulator's H200 profiles (bf16 and FP8) again: the GEMV, and mixed steps as graphs
    grep -q H200 "$OUT/gpu.txt" || { echo "not an H200: no profiles"; exit 0; }
    for m in llama3-8b:fp8 llama3-8b; do
        timeout 240 python3 -m blitzscale.cli.main profile --model "random:$m" --device cuda \
            --batches 1,8,32,64,128 --contexts 128,512,2048 --prefill 128,512,1024,2048,4096 \
            --out "$OUT/profile_${m/:/-}.json" > "$OUT/profile_${m/:/-}.log" 2>&1
        echo "$m rc=$?"; tail -2 "$OUT/profile_${m/:/-}.log"
    done
    ;;
esac
