"""A disk load into a buffer that served before (a worker's standby, handed out again)."""

from __future__ import annotations

from pathlib import Path

import torch

from blitzscale.checkpoint.convert import convert
from blitzscale.model.weights import ModelWeights
from blitzscale.transfer.disk import load_native


def test_a_disk_load_into_a_buffer_a_striped_transfer_filled_ends_all_ready(tmp_path: Path) -> None:
    """A transfer from three sources expects three pieces per segment; the disk reads one.
    Reused for a disk load (the standby resets its counts, not what they expect), the
    buffer must still end all ready, or its engine never runs a layer and it never counts
    as a full copy that may send."""
    folder = convert("random:tiny-llama3", tmp_path / "bz")
    fresh, _ = load_native(folder, 0, "cpu")
    buf = ModelWeights.empty(fresh.config, fresh.dtype, "cpu")
    buf.readiness.set_expected(3)  # as a striped transfer into it left it
    buf.readiness.reset()  # as the standby hands it out
    got, _ = load_native(folder, 0, "cpu", into=buf)
    assert got is buf and torch.equal(got.buffer, fresh.buffer)
    assert got.readiness.all_ready
