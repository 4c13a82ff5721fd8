"""Paced workers (`[engine] pace`, worker/pacing.py) serve the real model's tokens: greedy
SmolLM2 through a pd cluster (KV migration) with every step paced equals transformers'
own generation; a bad pace value is refused before any worker starts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.engine import SamplingParams
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig, load_serve_config
from blitzscale.serve.server import ServingCluster
from blitzscale.worker.pacing import resolve_pace
from tests.serve.conftest import running

PROMPTS = ("The quick brown fox", "def fibonacci(n):", "Once upon a time, in a land far away, there lived a")
MAX_NEW = 12
PACE = "reference:3"  # the same on any machine (plain "reference" depends on its cores)
CLI = [sys.executable, "-m", "blitzscale.cli.main"]


def _hf_greedy(hf: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        t = torch.tensor([ids])
        gen = hf.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=MAX_NEW)
    return gen[0, len(ids) :].tolist()


def test_paced_pd_serving_gives_transformers_tokens(smollm2_hf: Any, smollm2_tokenizer: Any) -> None:
    prompts = [smollm2_tokenizer.encode(p) for p in PROMPTS]
    want = [_hf_greedy(smollm2_hf, p) for p in prompts]
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 2},
        router={"mode": "pd"},
        policy={"name": "fixed", "fixed_prefill": 1, "fixed_decode": 1},
        engine={"pace": PACE},
    )
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)

    async def one(router: Any, k: int, ids: list[int]) -> list[int]:
        out: list[int] = []
        async for o in router.generate(f"paced-{k}", ids, params):
            out = list(o.token_ids)
        return out

    async def all_at_once(router: Any) -> list[list[int]]:  # (batched on both instances)
        return list(await asyncio.gather(*(one(router, k, p) for k, p in enumerate(prompts))))

    with running(cfg) as (service, lt):
        assert service.scaler is not None and service.scaler.pace is not None
        started = time.monotonic()
        got = lt.run(all_at_once(service.router))
        elapsed = time.monotonic() - started
    assert got == want
    # paced: the longest answer took at least one reference decode step per token after its first
    ref = resolve_pace(PACE, 2)
    assert ref is not None
    assert elapsed >= (max(map(len, want)) - 1) * ref.decode_s(1, 0)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("'nosuch-profile'", "[engine] pace = 'nosuch-profile': no profile 'nosuch-profile'"),
        ("'reference:0'", "[engine] pace = 'reference:0': the factor after 'reference:' must be a number"),
        ("3", "[engine] pace must be a string, got 3 (int)"),
    ],
)
def test_a_bad_pace_is_refused_before_any_worker_starts(tmp_path: Path, value: str, needle: str) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(f"[engine]\npace = {value}\n")
    r = subprocess.run([*CLI, "serve", "--config", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_service_refuses_a_bad_pace_before_spawning(tmp_path: Path) -> None:
    """The demo and the tests start the service without `serve`'s checks: the same refusal."""
    path = tmp_path / "cluster.toml"
    path.write_text("[engine]\npace = 'reference:fast'\n")
    service = ServingCluster(load_serve_config(path))
    lt = LoopThread()
    try:
        with pytest.raises(InvalidRequestError, match=r"\[engine\] pace = 'reference:fast'"):
            lt.run(service.start())
        assert service.cluster is None  # no worker was started
    finally:
        lt.close()
