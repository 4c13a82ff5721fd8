"""Processes of one tensor-parallel instance without a cluster: shard 0 runs an engine with a
`TPLeader`, the other shards run the worker's follower (its inbox and `TPFollower`) until
the leader stops. The same classes a serving worker uses (worker/tp.py, worker/world.py)."""

from __future__ import annotations

import os
import queue
import time
from datetime import timedelta
from typing import Any

import torch

LIMIT_S = 600  # for shard 0's result: generous, a loaded 2-core machine


def run_shards(tp: int, target: Any, args: Any, others_finish: bool = True) -> Any:
    """Run `target(*args(rank, store port, out queue))` in one process per shard; shard 0's
    result. `others_finish`: every shard must then exit cleanly; else the others are killed
    (a shard left waiting on purpose)."""
    import torch.distributed as dist

    from blitzscale.cluster.spawn import worker_context

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120)
    )
    ctx = worker_context()  # forked from a server that imported torch once, as workers are
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=args(r, store.port, out), daemon=True) for r in range(tp)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + LIMIT_S
        while True:  # a shard that dies fails the test at once, not at the deadline
            try:
                results = out.get(timeout=1.0)
                break
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a shard exited with {dead}"
                assert time.monotonic() < deadline, "no result in time"
        if others_finish:
            for p in procs:
                p.join(timeout=60)
            assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=60)


def follow(inbox: Any, follower: Any, weights_of: Any) -> None:
    """A follower's loop: its leader's commands, until the leader stops."""
    from blitzscale.messages import TPStopMsg

    while True:
        cmd = inbox.take()
        assert cmd is not None, inbox.lost
        follower.handle(cmd, weights_of)
        if isinstance(cmd, TPStopMsg):
            return


def instance_links(rank: int, port: int, tp: int) -> tuple[Any, Any]:
    """This shard's links (world.py) in a one-node instance of `tp` ranks on the store at
    `port`, and its instance group."""
    from blitzscale.worker.world import Links

    torch.set_num_threads(1)
    links = Links(rank, 0, "127.0.0.1", port, torch.device("cpu"), 120.0, tp)
    links.connect_instance(dict.fromkeys(range(tp), 0))
    group = links.instance
    assert group is not None
    return links, group


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
    from blitzscale.worker.tp import TPLeader
    from blitzscale.worker.tp_follower import TPFollower, TPInbox

    os.environ.setdefault("BLITZSCALE_CHECK_INTEGRITY", "1")
    links, group = instance_links(rank, port, tp)
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
            follow(inbox, follower, {spec: weights}.get)
    if rank == 0:
        out.put(results)
        out.close()
        out.join_thread()
    # A follower's inbox thread still waits in the control group's broadcast: leave without
    # tearing the group down under it (as a worker does, worker/worker.py).
    os._exit(0)


def live_shard_main(
    rank: int, port: int, spec: str, prompts: list[list[int]], max_tokens: int, out: Any
) -> None:
    """A live TP2 target in miniature: shard 0 has all its weights, shard 1's segments land
    one by one (a thread plays its transfer). Shard 0's engine serves live on the instance's
    readiness; it puts {"tokens", "prefixes" (what each refresh saw), "live_layers"} in `out`."""
    import threading
    import time

    import zmq

    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
    from blitzscale.messages import TPSetupMsg, TPStopMsg
    from blitzscale.worker.tp import InstanceReadiness, TPLeader
    from blitzscale.worker.tp_follower import TPFollower, TPInbox

    links, group = instance_links(rank, port, 2)
    weights = load_weights(resolve_model(spec), dtype=torch.float32, tp_size=2, tp_rank=rank)
    cfg = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=256, max_num_seqs=8)
    if rank == 0:
        leader = TPLeader(group)
        engine = LLMEngine(weights, None, cfg, tp_group=leader)
        leader.send(
            TPSetupMsg(
                model=spec,
                num_blocks=engine.counts()["total_blocks"],
                block_size=16,
                max_model_len=engine.max_model_len,
                live=True,
            )
        )
        assert leader.all_ok()
        ready = InstanceReadiness(weights.readiness, leader)
        engine.start_live(ready)
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        ids = [engine.add_request(p, params) for p in prompts]
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        prefixes, live_layers = [], 0
        while engine.has_unfinished():
            ready.refresh()
            prefixes.append(ready.num_ready_prefix)
            for o in engine.step():
                tokens[o.request_id] += o.new_token_ids
            if engine.live is not None:
                live_layers = engine.live.layers_run
            if engine.live_drained:
                engine.end_live()
        leader.send(TPStopMsg())
        leader.flush()
        out.put({"tokens": [tokens[i] for i in ids], "prefixes": prefixes, "live_layers": live_layers})
        out.close()
        out.join_thread()
    else:
        weights.readiness.reset()  # its transfer: one segment every 0.2 s

        def land() -> None:
            for seg in range(weights.readiness.num_segments):
                time.sleep(0.2)
                weights.readiness.add(seg)

        inbox = TPInbox(zmq.Context.instance(), group)
        follower = TPFollower(links, group)
        threading.Thread(target=land, daemon=True).start()
        follow(inbox, follower, {spec: weights}.get)
    os._exit(0)


def failing_leader_main(rank: int, port: int, spec: str, out: Any) -> None:
    """A TP2 instance behind shard 0's serving loop (the worker's `ServingLoop`): a request
    served end to end; one whose step fails after the forward (in its stop check), then the
    first prompt again; then a step whose leader fails after its shards began the layers
    (they wait in that step's all-reduce). Shard 0 puts {"tokens", "post" (the second's
    finish reason and error), "again" (the third's tokens), "raised", "message"} in `out`:
    what the loop raised on the last step, if anything, within 50 ticks."""
    import zmq

    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.engine import EngineConfig, SamplingParams
    from blitzscale.messages import ActivateMsg, GenerateMsg, OutputsMsg, sampling_msg
    from blitzscale.worker.serving import ServingLoop
    from blitzscale.worker.tp_follower import TPFollower, TPInbox

    links, group = instance_links(rank, port, 2)
    weights = load_weights(resolve_model(spec), dtype=torch.float32, tp_size=2, tp_rank=rank)
    if rank != 0:  # follows until killed: the failed step leaves it in an all-reduce
        follow(TPInbox(zmq.Context.instance(), group), TPFollower(links, group), {spec: weights}.get)
        os._exit(0)
    sent: list[Any] = []
    serving = ServingLoop(0, links, sent.append, lambda *a: None)
    engine = EngineConfig(block_size=16, num_kv_blocks=64, max_model_len=256)
    serving.activate(
        weights, None, ActivateMsg(op_id=1, model=spec, source=spec, role="colocated", engine=engine)
    )
    params = sampling_msg(SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    prompt = [5, 9, 17, 33, 2]

    def run(rid: str) -> list[Any]:
        serving.handle(GenerateMsg(request_id=rid, prompt_token_ids=prompt, params=params))
        while not serving.is_idle:
            serving.tick()
        return [o for m in sent if isinstance(m, OutputsMsg) for o in m.outputs if o.request_id == rid]

    tokens = [t for o in run("ok") for t in o.new_token_ids]
    # a failure after the forward (its collectives done) fails only its request
    e = serving.engine
    assert e is not None
    real_stop = e.outputs.check_stop

    def check_stop(req: Any) -> Any:
        if req.request_id == "post":
            raise RuntimeError("injected: after the forward")
        return real_stop(req)

    e.outputs.check_stop = check_stop  # type: ignore[method-assign]
    post = run("post")[-1]
    e.outputs.check_stop = real_stop  # type: ignore[method-assign]
    again = [t for o in run("again") for t in o.new_token_ids]
    tp = serving.tp
    assert tp is not None
    real = tp.on_layers

    def failing(*args: Any) -> None:
        real(*args)  # the shards have the command: they run the layers, then all-reduce
        raise RuntimeError("injected: shard 0 failed after its shards began the layers")

    tp.on_layers = failing  # type: ignore[method-assign]
    serving.handle(GenerateMsg(request_id="bad", prompt_token_ids=[7, 7, 7], params=params))
    result: dict[str, Any] = {
        "tokens": tokens,
        "post": (post.finish_reason, post.error),
        "again": again,
        "raised": None,
        "message": "",
    }
    try:
        for _ in range(50):
            serving.tick()
    except Exception as e:  # what the worker's main loop would die of
        result.update(raised=type(e).__name__, message=str(e))
    out.put(result)
    out.close()
    out.join_thread()
    os._exit(0)
