"""TTFT of a burst that arrives at the moment of a scale decision, per load path.

One serving instance (rank 0) is up; a burst of `requests` prompts arrives and, at the same
instant, a second instance (rank 1) is ordered up by one path:

- `live`: network multicast from rank 0 with live scaling (ZigZag, policy `blitz`);
- `network`: the same transfer, serving only once loaded (policy `blitz-nolive`);
- `host`: from the cluster's one pinned host copy (what a ServerlessLLM cache hit does);
- `disk`: a cold read of our per-rank file (page cache dropped; a cache miss);
- `none`: no scale-up at all (the floor every path must beat).

Every variant starts a fresh cluster, so none inherits another's warm state. The burst's
tokens are checked identical across variants (greedy). Prints JSON.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from blitzscale.control.policies import LoadAction
from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.config import ServeConfig

if TYPE_CHECKING:  # (the server brings torch: the CLI checks its flags without it)
    from blitzscale.serve.server import ServingCluster

PATHS = ("live", "network", "host", "disk", "none")


@dataclass(frozen=True)
class LiveBenchConfig:
    model: str = "random:llama3-8b"
    device: str = "cuda"
    paths: tuple[str, ...] = PATHS
    requests: int = 64
    prompt_len: int = 1024
    max_tokens: int = 4
    transfer_bytes_per_s: float = 0.0  # cap on network transfers (0: the link's speed)
    disk_bytes_per_s: float = 0.0
    num_kv_blocks: int = 0  # per instance; 0: sized from free memory
    cache_dir: str = ""


def _serve_config(cfg: LiveBenchConfig) -> ServeConfig:
    return ServeConfig().with_overrides(
        model={"name": cfg.model, "cache_dir": cfg.cache_dir},
        cluster={
            "num_workers": 2,
            "device": cfg.device,
            "transfer_bytes_per_s": cfg.transfer_bytes_per_s,
            "disk_bytes_per_s": cfg.disk_bytes_per_s,
        },
        router={"mode": "colocated", "max_requests_per_instance": max(64, cfg.requests)},
        engine={
            "num_kv_blocks": cfg.num_kv_blocks,
            "max_model_len": cfg.prompt_len + cfg.max_tokens + 16,
            "max_num_seqs": max(64, cfg.requests),
        },
        policy={"name": "fixed", "fixed_prefill": 1},  # no planner: the bench decides
    )


def _action(path: str) -> LoadAction | None:
    if path == "live":
        return LoadAction((1,), "network", (0,), multicast=True, live=True, partner=0)
    if path == "network":
        return LoadAction((1,), "network", (0,), multicast=True)
    if path == "host":
        return LoadAction((1,), "host", (0,))
    if path == "disk":
        return LoadAction((1,), "disk")
    return None


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    return [[(7919 * i + 104729 * j) % (vocab - 10) + 5 for j in range(length)] for i in range(n)]


async def _burst(
    service: ServingCluster, path: str, prompts: list[list[int]], max_tokens: int
) -> dict[str, Any]:
    router, scaler = service.router, service.scaler
    assert router is not None and scaler is not None
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ttft: dict[str, float] = {}
    outs: dict[str, list[int]] = {}

    async def one(i: int, t0: float) -> None:
        rid = f"{path}-{i}"
        toks: list[int] = []
        async for o in router.generate(rid, prompts[i], params):
            if rid not in ttft and o.new_token_ids:
                ttft[rid] = time.monotonic() - t0
            toks += o.new_token_ids
        outs[rid] = toks

    t0 = time.monotonic()
    tasks = [asyncio.create_task(one(i, t0)) for i in range(len(prompts))]
    action = _action(path)
    if action is not None:
        scaler._launch(action)  # the scale decision, at the burst's arrival
    await asyncio.gather(*tasks)
    done = time.monotonic() - t0
    while scaler.busy:  # the load may outlast the burst
        await asyncio.sleep(0.05)
    ups = [e for e in scaler.events if e.is_up and e.ranks == (1,)]
    values = sorted(ttft.values())
    return {
        "path": path,
        "ttft_s": {
            "mean": statistics.fmean(values),
            "p50": values[len(values) // 2],
            "p90": values[int(0.9 * (len(values) - 1))],
            "max": values[-1],
        },
        "burst_done_s": done,
        "load_s": ups[-1].seconds if ups else None,
        "link_s": ups[-1].link_s if ups else None,  # the transfer itself, from the report
        "first_layer_s": ups[-1].first_layer_s if ups else None,
        "senders_done_s": ups[-1].senders_done_s if ups else None,
        "replied_s": ups[-1].replied_s if ups else None,  # all replies at the controller
        "load_done_at_s": (ups[-1].time - t0) if ups else None,
        "live_requests": router.live.requests_total,
        "live_layers": router.live.layers_total,
        "relays": router.live.relays_total,
        "tokens": [outs[f"{path}-{i}"] for i in range(len(prompts))],
    }


def run_variant(cfg: LiveBenchConfig, path: str) -> dict[str, Any]:
    from blitzscale.serve.background import LoopThread
    from blitzscale.serve.server import ServingCluster

    lt = LoopThread()
    service = ServingCluster(_serve_config(cfg))
    try:
        t = time.monotonic()
        lt.run(service.start())
        started = time.monotonic() - t
        router, cluster = service.router, service.cluster
        assert router is not None and cluster is not None
        if path == "host":  # the cluster's one host copy (kept by every policy but fixed)
            lt.run(cluster.cache_on_host(service.cfg.model.name, 0))
        prompts = _prompts(cfg.requests, cfg.prompt_len, router.vocab_size)
        lt.run(_burst(service, "warmup", prompts[:2], 1))  # kernels and allocator warm
        result = lt.run(_burst(service, path, prompts, cfg.max_tokens))
        result["cluster_start_s"] = started
        return result
    finally:
        lt.run(service.stop())
        lt.close()


def run_live_bench(cfg: LiveBenchConfig) -> dict[str, Any]:
    results = [run_variant(cfg, p) for p in cfg.paths]
    tokens = [r.pop("tokens") for r in results]
    same = [sum(a == b for a, b in zip(t, tokens[0], strict=True)) / len(t) for t in tokens]
    return {
        "config": asdict(cfg),
        # bf16 greedy tokens depend on how requests happen to be batched, so paths can differ
        # in a few tokens without any bug (fp32 runs are identical: tests/gpu/test_cuda_live.py)
        "share_of_outputs_identical_to_first_path": dict(zip(cfg.paths, same, strict=True)),
        "results": results,
    }
