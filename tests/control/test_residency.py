"""How many models a rank holds at once, derived (control/residency.py)."""

from __future__ import annotations

from blitzscale.control.residency import Footprint, derive_models_per_rank, resolve_models_per_rank

GB = 10**9
H200 = 143 * GB
LLAMA_8B = Footprint(16 * GB, 1 * GB)  # bf16 weights, one 8192-token request of KV


def test_as_many_as_fit_but_no_more_than_the_models() -> None:
    assert derive_models_per_rank([LLAMA_8B] * 6, H200, 0.9, gpu=True) == 6  # 128.7 GB / 17 GB = 7
    assert derive_models_per_rank([LLAMA_8B] * 9, H200, 0.9, gpu=True) == 7
    assert derive_models_per_rank([LLAMA_8B] * 2, H200, 0.9, gpu=True) == 2


def test_the_largest_model_sets_the_share() -> None:
    big = Footprint(48 * GB, 2 * GB)  # a 24B model: 50 GB
    assert derive_models_per_rank([LLAMA_8B, LLAMA_8B, big], H200, 0.9, gpu=True) == 2  # 128.7 // 50


def test_one_when_nothing_can_be_shared() -> None:
    assert derive_models_per_rank([LLAMA_8B], H200, 0.9, gpu=True) == 1  # one model
    assert derive_models_per_rank([LLAMA_8B] * 3, H200, 0.9, gpu=False) == 1  # a CPU worker
    assert derive_models_per_rank([LLAMA_8B] * 3, H200, 0.9, gpu=True, tp=2) == 1  # a TP rank
    assert derive_models_per_rank([LLAMA_8B] * 3, 0, 0.9, gpu=True) == 1  # memory unknown
    assert derive_models_per_rank([Footprint(200 * GB, 0)] * 3, H200, 0.9, gpu=True) == 1  # none fits


def test_asked_is_kept() -> None:
    assert resolve_models_per_rank(3, [LLAMA_8B] * 6, H200, 0.9, gpu=True) == 3
    assert resolve_models_per_rank(2, [LLAMA_8B] * 3, H200, 0.9, gpu=False) == 2
    assert resolve_models_per_rank(0, [LLAMA_8B] * 6, H200, 0.9, gpu=True) == 6
