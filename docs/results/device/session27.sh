#!/usr/bin/env bash
# Session 27's device runs (issue 32 on a GPU; make test-gpu), one step per call:
#   bash docs/results/device/session27.sh bench|tests|quick|profile
# Writes under $OUT (the device tool's folder; ./out elsewhere). Needs the wheels in .whl/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
source .whl/setup.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
bs() { python3 -m blitzscale.cli.main "$@"; }
# PCIe both ways at once (the simulator's full-duplex assumption), ~10 s
python3 docs/results/pcie_duplex.py | tee "$OUT/pcie_duplex.json"
case "$1" in
bench)
    # FP8 against bf16 in one run (issue 32's decode, prefill and cosine figures)
    (time timeout 330 python3 -m blitzscale.cli.main bench engine --model random:llama3-8b --device cuda --dtype fp8 \
        --batch-sizes 1,2,4,8,16,32,64 --context-lens 512 >"$OUT/bench_engine_fp8.json") 2>"$OUT/bench_engine.err"
    tail -3 "$OUT/bench_engine.err"
    # host copy and disk paths, FP8 against bf16 in one run (one GPU: no network paths)
    (time timeout 150 python3 -m blitzscale.cli.main bench transfer --model random:llama3-8b --dtype fp8 \
        --workers 1 --device cuda --mode host,disk >"$OUT/bench_transfer_fp8.json") 2>"$OUT/bench_transfer.err"
    tail -3 "$OUT/bench_transfer.err"
    python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/bench_engine_fp8.json"))
print(d["device_name"], json.dumps(d["fp8_over_dense"]), json.dumps(d["fp8_logits_vs_dense_dequantized"]))
try:
    t = json.load(open(f"{sys.argv[1]}/bench_transfer_fp8.json"))
    print(json.dumps(t.get("fp8_over_dense")))
except Exception as e:
    print("transfer:", e)
PY
    ;;
tests)
    set -o pipefail
    timeout 560 make test-gpu 2>&1 | tee "$OUT/test_gpu.log" | grep -v '^[.sx]*$' | tail -40
    ;;
quick)
    # what fits a short lease: the GPU tests of what changed since they last ran
    set -o pipefail
    timeout 400 python3 -m pytest tests/gpu/test_cuda_fp8.py tests/gpu/test_cuda_transfer.py \
        tests/gpu/test_cuda_standby.py tests/gpu/test_cuda_live.py -m gpu -q -p no:cacheprovider \
        --confcutdir=tests/gpu 2>&1 | tee "$OUT/test_gpu_quick.log" | tail -15
    ;;
profile)
    bs profile --model random:llama3-8b:fp8 --device cuda --batches 1,8,32,64,128 --contexts 128,512,2048 \
        --prefill 128,512,1024,2048,4096 --out "$OUT/profile_llama3-8b-fp8.json" 2>&1 | tail -5
    ;;
esac
