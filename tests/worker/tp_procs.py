"""Processes of one tensor-parallel instance without a cluster: shard 0 runs an engine with a
`TPLeader`, the other shards run the worker's follower (its inbox and `TPFollower`) until
the leader stops. The same classes a serving worker uses (worker/tp.py, worker/world.py)."""

from __future__ import annotations

import os
from typing import Any

import torch


def shard_main(
    rank: int,
    tp: int,
    port: int,
    specs: list[str],
    prompts: dict[str, list[list[int]]],
    max_tokens: int,
    out: Any,
) -> None:
    """`specs`: model specs to run one after another; shard 0 puts {spec: token lists} in `out`."""
    import zmq

    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
    from blitzscale.messages import TPSetupMsg, TPStopMsg
    from blitzscale.worker.tp import TPFollower, TPInbox, TPLeader
    from blitzscale.worker.world import Links

    torch.set_num_threads(1)
    os.environ.setdefault("BLITZSCALE_CHECK_INTEGRITY", "1")
    links = Links(rank, 0, "127.0.0.1", port, torch.device("cpu"), 120.0, tp)
    links.connect_instance(dict.fromkeys(range(tp), 0))
    group = links.instance
    assert group is not None
    results: dict[str, list[list[int]]] = {}
    cfg = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=24, max_num_seqs=8)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    inbox = None if rank == 0 else TPInbox(zmq.Context.instance(), group)
    follower = None if rank == 0 else TPFollower(links, group)
    for spec in specs:
        weights = load_weights(resolve_model(spec), dtype=torch.float32, tp_size=tp, tp_rank=rank)
        if rank == 0:
            leader = TPLeader(group)
            engine = LLMEngine(weights, None, cfg, tp_group=leader)
            blocks = engine.counts()["total_blocks"]
            leader.send(
                TPSetupMsg(model=spec, num_blocks=blocks, block_size=16, max_model_len=engine.max_model_len)
            )
            assert leader.all_ok()
            together = engine.generate(prompts[spec], params)  # batched, chunked prefill
            alone = [engine.generate([p], params)[0] for p in prompts[spec][:2]]
            leader.send(TPStopMsg())
            leader.flush()
            results[spec] = [o.token_ids for o in together] + [o.token_ids for o in alone]
            assert engine.pool.num_free_blocks == engine.pool.num_blocks
        else:
            assert inbox is not None and follower is not None
            while True:
                cmd = inbox.take()
                assert cmd is not None, inbox.lost
                follower.handle(cmd, {spec: weights})
                if isinstance(cmd, TPStopMsg):
                    break
    if rank == 0:
        out.put(results)
        out.close()
        out.join_thread()
    # A follower's inbox thread still waits in the control group's broadcast: leave without
    # tearing the group down under it (as a worker does, worker/worker.py).
    os._exit(0)
