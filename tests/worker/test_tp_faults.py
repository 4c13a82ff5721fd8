"""A tensor-parallel instance whose leader fails part-way through a step (CPU, gloo, two
processes): its serving loop must end the worker at once (`WorkerBrokenError`) rather than
fail the step's requests and go on (a failure after the forward, its collectives done, fails
only its requests, as on any instance). The other shard is then inside that step's all-reduce,
and the next step's collectives would pair with it: a hang, or sums of the wrong tensors
(the cluster stops and respawns the whole group when one member dies:
tests/cluster/test_tp_respawn.py)."""

from __future__ import annotations

from tests.worker.tp_procs import failing_leader_main, run_shards


def test_a_failed_tensor_parallel_step_ends_the_leaders_worker() -> None:
    spec = "random:tiny-llama3"
    # shard 1 is left in the failed step's all-reduce: killed once shard 0 has answered
    result = run_shards(
        2, failing_leader_main, lambda r, port, out: (r, port, spec, out), others_finish=False
    )
    assert len(result["tokens"]) == 3  # the group served before the fault
    # a failure after the forward fails its request only; the group serves on, in step
    assert result["post"][0] == "error" and "after the forward" in result["post"][1]
    assert result["again"] == result["tokens"]
    assert result["raised"] == "WorkerBrokenError", result
    assert "tensor-parallel" in result["message"] and "injected" in result["message"], result["message"]
