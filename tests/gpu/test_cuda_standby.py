"""A GPU worker's standby engine (worker/standby.py): an instance brought back from the host
copy is activated with the engine the worker built beforehand (decode graphs captured), and
without a standby it is built at activation. Run on a GPU machine with `make test-gpu`."""

from __future__ import annotations

import pytest
import torch

from blitzscale.bench.standby_bench import StandbyBenchConfig, run_standby_bench

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_activation_takes_the_standby_engine() -> None:
    cfg = StandbyBenchConfig(model="random:tiny-llama3", device="cuda", max_model_len=512, runs=("on", "off"))
    on, off = run_standby_bench(cfg)["runs"]
    assert on["used_standby"] and not off["used_standby"]
    assert on["num_kv_blocks"] > 0 and off["num_kv_blocks"] > 0
