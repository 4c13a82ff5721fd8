"""What prompt logprobs (`echo` with `logprobs`, lm-evaluation-harness's scoring requests)
cost on the GPU: one prompt's time to its first token with and without them, random
Llama-3-8B weights (bf16), the engine's default configuration (CUDA graphs for one-prompt
steps up to 512 tokens; a prompt that asks for its logprobs runs eagerly and computes the
logits of every position, in 256-row slices of the 128,256-token vocabulary). Prefix
caching is off: each repeat computes the whole prompt.

Run on the GPU machine: `OUT=. python3 docs/results/prompt_logprobs_cost.py` (prints one
JSON object; writes prompt_logprobs_cost_<gpu>.json under $OUT). Best of 5 each.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1].parent))

from blitzscale.core.config import EngineConfig
from blitzscale.engine import LLMEngine, SamplingParams

LENGTHS = (128, 512, 2048)
ASKS = {"none": None, "prompt_logprobs=0": 0, "prompt_logprobs=5": 5}


def first_token_ms(engine: LLMEngine, prompt: list[int], k: int | None) -> float:
    best = float("inf")
    for i in range(6):  # (the first is a warm-up)
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k)
        torch.cuda.synchronize()
        t = time.perf_counter()
        rid = engine.add_request(prompt, params, f"r{k}-{len(prompt)}-{i}")
        while not any(o.request_id == rid and o.finished for o in engine.step()):
            pass
        torch.cuda.synchronize()
        if i:
            best = min(best, (time.perf_counter() - t) * 1000)
    return round(best, 2)


def main() -> None:
    engine = LLMEngine.from_model(
        "random:llama3-8b", device="cuda", config=EngineConfig(max_model_len=4096, prefix_caching=False)
    )
    g = torch.Generator().manual_seed(0)
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "ms": {}}
    for n in LENGTHS:
        prompt = torch.randint(0, 128256, (n,), generator=g).tolist()
        out["ms"][n] = {name: first_token_ms(engine, prompt, k) for name, k in ASKS.items()}
        print(n, out["ms"][n], flush=True)
    name = "prompt_logprobs_cost_" + torch.cuda.get_device_name().split()[1].lower() + ".json"
    Path(os.environ.get("OUT", "."), name).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
