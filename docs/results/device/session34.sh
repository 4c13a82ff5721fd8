#!/usr/bin/env bash
# Session 34's device runs (issue 32 on an H200: its FP8 figures since PDL, fast accumulation
# and the qkv scales; its simulator profile; the FP8 path's logits on a trained model), one
# step per call:   bash docs/results/device/session34.sh h200|profile|smol_a|smol|tests
# Writes under $OUT (the device tool's folder; ./out elsewhere). Needs the wheels in .whl/.
# `smol`: SmolLM2-135M's GGUF (98 MB, over one call's 64 MiB) travels in two carried halves,
# out/smol_a/part (the call `smol_a`, which only checks it arrived) and out/smol_b/part.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
source .whl/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
bench_fp8() {  # $1: the JSON's name, $2 its time limit, $3 the model; bf16 beside FP8 in one run
    timeout "$2" python3 -m blitzscale.cli.main bench engine --model "$3" --device cuda \
        --dtype fp8 --batch-sizes 1,2,4,8,16,32,64 --context-lens 512 --no-hf > "$OUT/$1.json" 2> "$OUT/$1.err"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['device_name'], d['fp8_over_dense'], d['fp8_logits_vs_dense_dequantized'])" \
        "$OUT/$1.json" 2>&1 | tail -2
}
profile_h200() {  # $1: its time limit; the simulator's FP8 profile, on an H200 only
    grep -q H200 "$OUT/gpu.txt" || { echo "not an H200: no profile"; return 0; }
    timeout "$1" python3 -m blitzscale.cli.main profile --model random:llama3-8b:fp8 --device cuda \
        --batches 1,8,32,64,128 --contexts 128,512,2048 --prefill 128,512,1024,2048,4096 \
        --out "$OUT/profile_llama3-8b-fp8.json" > "$OUT/profile_llama3-8b-fp8.log" 2>&1
    echo "profile rc=$?"; tail -2 "$OUT/profile_llama3-8b-fp8.log"
}
case "$1" in
h200)
    timeout 120 python3 -m pytest tests/gpu/test_cuda_fp8.py -m gpu -q -x -p no:cacheprovider \
        --confcutdir=tests/gpu > "$OUT/test_cuda_fp8.log" 2>&1
    echo "tests rc=$?"; tail -1 "$OUT/test_cuda_fp8.log"
    bench_fp8 bench_engine_fp8_run1 160 random:llama3-8b
    profile_h200 290
    ;;
profile)
    # the simulator's H200 FP8 profile alone (the budget's last minutes): nothing elsewhere
    profile_h200 280
    ;;
smol_a)
    ls -la out/smol_a/
    ;;
smol)
    mkdir -p /tmp/smol && cat out/smol_a/part out/smol_b/part > /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
    md5sum /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf  # a1231443440b107ff29f02bdb38c9d0a
    bench_fp8 bench_engine_fp8_smollm2 150 /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
    bench_fp8 bench_engine_fp8_run2 160 random:llama3-8b
    ;;
tests)
    exec bash docs/results/device/session32.sh tests
    ;;
esac
