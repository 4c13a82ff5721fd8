"""No Triton kernel compiles once an engine is built, whatever the steps' shapes.

A kernel compiled under load stalls the step that needs it by 0.2-0.5 s on an H200: in
`bench serve`'s closed loops 22 compiles cost the served engine 5.8 s of its first minute
(alignment of the metadata's views, the block table's width and the decode splits each
picked another variant). Run in a fresh process with an empty Triton cache, so nothing
compiled by another test can hide a compile. Run on a GPU machine with `make test-gpu`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCRIPT = r"""
import json, torch
from triton import knobs
from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams

w = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.bfloat16, device="cuda")
cfg = EngineConfig(block_size=16, num_kv_blocks=4096, max_num_seqs=48, max_num_batched_tokens=700)
e = LLMEngine(w, None, cfg)
compiled = []
knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["fn"].name) or False
g = torch.Generator().manual_seed(5)
steps = k = 0
while steps < 400 and (k < 120 or e.has_unfinished()):
    for _ in range(int(torch.randint(0, 3, (1,), generator=g))) if k < 120 else []:
        n = int(torch.randint(1, 900, (1,), generator=g))  # odd, even, chunked over steps (context 1024)
        m = int(torch.randint(1, 40, (1,), generator=g))
        p = SamplingParams(max_tokens=m, temperature=0, ignore_eos=True)
        e.add_request(torch.randint(0, w.config.vocab_size, (n,), generator=g).tolist(), p)
        k += 1
    e.step()
    steps += 1
print(json.dumps({"compiled": compiled, "steps": steps, "requests": k}))
"""


def test_steps_of_any_shape_compile_no_kernel_after_the_engine_is_built(tmp_path) -> None:
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["requests"] >= 100 and result["steps"] >= 120, result
    assert result["compiled"] == [], result
