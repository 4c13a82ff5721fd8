"""The planner's prefill band typed (0.5 / 0.7 s of queued prompt work per instance) against
the band from each model's TTFT SLO (the default since session 22), on the simulated
`paper-a`: `blitzscale simulate` with blitz, blitz-nolive, sllm and fixed-peak (the most
instances blitz held at once, all the time), for Llama-3-8B and Mistral-24B TP2, on the
shipped Azure code slice, the shipped Mooncake slice and, when given, the first 15 minutes
of the whole Azure code trace (AzureLLMInferenceTrace_code.csv from Azure's public
AzurePublicDataset, 2023). Prints JSON; two minutes on a 2-core machine without the whole
trace, about ten with it.

    .venv/bin/python docs/results/sim_slo_band.py [--azure-code PATH] > docs/results/sim_slo_band.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "blitzscale" / "data"
POLICIES = "blitz,blitz-nolive,sllm,fixed-peak"
BANDS = {
    "typed 0.5/0.7": ["--planner", "prefill_upper=0.7", "--planner", "prefill_lower=0.5"],
    "from SLO": [],
}
MODELS = ("llama3-8b", "mistral-24b")
KEEP = ("ttft_mean_s", "ttft_p99_s", "slo_attainment", "gpu_seconds", "scale_ups")


def run(trace: list[str], model: str, band: list[str]) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "blitzscale.cli.main",
            "simulate",
            "--preset",
            "paper-a",
            "--model",
            model,
        ]
        cmd += [*trace, "--policy", POLICIES, "--quiet", "--out", out, *band]
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
        rows = json.loads((Path(out) / "comparison.json").read_text())
    return {r["policy"]: {k: round(r[k], 4) for k in KEEP} for r in rows}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--azure-code", default="", help="the whole Azure code trace (its first 15 minutes run)")
    args = p.parse_args()
    traces = {
        "azure code slice": ["--format", "azure", "--trace", str(DATA / "azure_code_2023_slice.csv")],
        "mooncake slice": ["--format", "mooncake", "--trace", str(DATA / "mooncake_synthetic_slice.jsonl")],
    }
    if args.azure_code:
        traces["azure code, first 15 min"] = [
            "--format",
            "azure",
            "--trace",
            args.azure_code,
            "--duration",
            "900",
        ]
    result: dict = {"preset": "paper-a", "mode": "pd", "policies": POLICIES.split(","), "runs": {}}
    for name, trace in traces.items():
        for model in MODELS:
            for band, flags in BANDS.items():
                result["runs"][f"{name} | {model} | {band}"] = run(trace, model, flags)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
