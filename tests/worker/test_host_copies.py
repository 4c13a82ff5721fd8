"""A rank's host copies are made on a thread of their own (worker/host_copies.py): the copy
equals the weights, a command that needs it (or frees the weights it reads) waits for it,
and a second copy of one model, or a copy of weights still arriving, is refused."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from blitzscale.messages import HostCopyResult
from blitzscale.model.weights import ModelWeights
from blitzscale.worker.host_copies import HostCopies


def _landed(weights: Any) -> ModelWeights:
    w = ModelWeights(weights.config, weights.layout, weights.buffer.clone())
    w.readiness.mark_all_ready()
    return w


def test_a_copy_made_on_its_thread_equals_the_weights_and_is_collected(tiny_weights: Any) -> None:
    weights = _landed(tiny_weights("tiny-llama3"))
    copies = HostCopies(torch.device("cpu"))
    answered = threading.Event()
    got: list[tuple[HostCopyResult | None, str]] = []

    def done(result: HostCopyResult | None, err: str) -> None:
        got.append((result, err))
        answered.set()

    copies.start("a", weights, done)
    assert "a" in copies
    with pytest.raises(ValueError, match="already has a host copy of a"):
        copies.start("a", weights, done)
    assert answered.wait(60)
    ((result, err),) = got
    assert err == "" and result is not None and result.bytes == weights.layout.nbytes and not result.pinned
    copies.settle()
    host = copies.held("a")
    assert host is not None and torch.equal(host.buffer, weights.buffer)
    assert host.buffer.data_ptr() != weights.buffer.data_ptr() and host.readiness.all_ready
    copies.drop("a")
    assert "a" not in copies and copies.held("a") is None and copies.finish("a") is None


def test_finish_waits_for_a_copy_still_being_made(tiny_weights: Any) -> None:
    """`finish` is what a release, a checksum or a transfer from the host copy call first."""
    weights = _landed(tiny_weights("tiny-qwen2"))
    copies = HostCopies(torch.device("cpu"))
    release = threading.Event()

    def done(result: HostCopyResult | None, err: str) -> None:
        release.wait(60)  # the reply is held back: the thread has not ended yet

    copies.start("b", weights, done)
    assert copies.held("b") is None  # (nothing collectable until the thread has ended)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    host = copies.finish("b")
    assert host is not None and torch.equal(host.buffer, weights.buffer)


def test_weights_still_arriving_get_no_host_copy(tiny_weights: Any) -> None:
    weights = _landed(tiny_weights("tiny-llama3"))
    weights.readiness.reset()
    copies = HostCopies(torch.device("cpu"))
    with pytest.raises(ValueError, match="only part of c"):
        copies.start("c", weights, lambda r, e: None)
    assert "c" not in copies
