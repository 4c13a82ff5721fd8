"""A simulator preset (`simulate --preset FILE.toml`) is read strictly: every shipped one
loads, and a section it does not have, or a topology value of the wrong type, is named
rather than ignored or truncated."""

from __future__ import annotations

from pathlib import Path

import pytest

from blitzscale.sim.config import PRESETS_DIR, SimConfigError, load_preset

DEVICE = '[device]\nname = "h200"\nmemory_bytes = 141e9\n'


@pytest.mark.parametrize("name", sorted(p.stem for p in PRESETS_DIR.glob("*.toml") if p.stem != "models"))
def test_every_shipped_preset_loads(name: str) -> None:
    assert load_preset(name).topology.nodes >= 1


@pytest.mark.parametrize(
    ("topology", "extra", "says"),
    [
        ("nodes = 2.5\ngpus_per_node = 8\n", "", "[topology] nodes must be an integer, got 2.5"),
        ('nodes = "four"\ngpus_per_node = 8\n', "", "[topology] nodes must be an integer, got 'four'"),
        (
            'nodes = 1\ngpus_per_node = 8\nnvlink_bytes_per_s = "fast"\n',
            "",
            "nvlink_bytes_per_s must be a number",
        ),
        ("nodes = 1\ngpus_per_node = 8\n", "[bogus]\nx = 1\n", "unknown section [bogus]"),
    ],
)
def test_a_bad_preset_is_named(tmp_path: Path, topology: str, extra: str, says: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(f"[topology]\n{topology}{DEVICE}{extra}")
    with pytest.raises(SimConfigError) as err:
        load_preset(str(path))
    assert says in str(err.value) and str(path) in str(err.value)
