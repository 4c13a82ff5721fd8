"""The control plane's state has one owner (`serve/state.py`): states change there, checked
against the design's state machine, and no other module writes an instance's fields."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import blitzscale
from blitzscale.control.snapshot import InstanceState as S
from blitzscale.messages import StatsMsg
from blitzscale.serve.state import ControlState, Relay

INSTANCE_FIELDS = {
    "state",
    "stats",
    "outstanding_tokens",
    "num_assigned",
    "live_ready",
    "idle_since",
    "loaded_at",
    "load_s",
}


def test_states_change_along_the_state_machine_only() -> None:
    st = ControlState()
    st.move(3, S.LOADING, "(disk)")
    with pytest.raises(ValueError):
        st.move(3, S.DECODE)  # decode instances are only made by mutation
    st.move(3, S.PREFILL)
    st.move(3, S.MUTATING_TO_DECODE)
    st.move(3, S.DECODE)
    seen = [b for _, _, b in st.instances[3].transitions]
    assert seen == ["loading", "prefill", "mutating_to_decode", "decode"]
    with pytest.raises(TypeError):
        st.instances[4] = st.instances[3]  # type: ignore[index]  # read-only to everyone else


def test_an_instance_that_goes_inactive_forgets_its_work_and_engine_numbers() -> None:
    """A dead (or released) engine's last stats must not count as KV still in use, nor make
    the instance look busy, once the rank is back (respawned) and holds nothing."""
    st = ControlState()
    st.move(0, S.LOADING)
    st.move(0, S.COLOCATED)
    st.assign(0, 100)
    st.on_stats(StatsMsg(rank=0, num_running=3, num_waiting=0, num_held=0, used_blocks=58, total_blocks=256))
    inst = st.instances[0]
    assert not inst.is_idle and inst.idle_since is None and inst.outstanding_tokens == 100
    st.move(0, S.INACTIVE, "(worker died)")
    assert inst.stats is None and inst.is_idle and inst.view().used_blocks == 0
    assert inst.num_assigned == inst.outstanding_tokens == 0
    st.on_stats(StatsMsg(rank=0, num_running=1, num_waiting=0, num_held=0, used_blocks=5, total_blocks=256))
    assert inst.stats is None  # a stray last report of the gone engine


def test_work_accounting_never_goes_negative_and_tracks_idleness() -> None:
    st = ControlState()
    st.move(1, S.LOADING)
    st.move(1, S.PREFILL)
    assert st.instances[1].idle_since is not None
    st.assign(1, 10)
    st.take_tokens(1, 25)
    assert st.instances[1].outstanding_tokens == 0
    st.unassign(1)
    st.unassign(1)
    assert st.instances[1].num_assigned == 0 and st.instances[1].idle_since is not None
    st.take_tokens(None, 5)  # a request that was on no instance
    st.unassign(7)  # an instance never seen


def test_live_pairs_and_relays() -> None:
    st = ControlState()
    st.pair((2, 3), 1)
    assert dict(st.pairs) == {2: 1, 3: 1} and st.is_source(1)
    st.add_relay("r", Relay(2, 1))
    st.relay_sent("r")
    assert st.relays["r"].sent
    assert st.end_relay("r") is not None and st.end_relay("r") is None
    st.orphan(1)
    assert dict(st.pairs) == {2: None, 3: None} and not st.is_source(1)
    assert st.unpair(2) is None and 2 not in st.pairs


def test_only_the_owner_writes_instance_fields_or_live_tables() -> None:
    """Static check over the package: an assignment to an instance field (`x.state = ...`,
    `x.num_assigned += 1`) appears in serve/state.py alone, and nobody else calls the
    owner's private tables."""
    root = Path(blitzscale.__file__).parent
    offenders = []
    for path in sorted((root / "serve").rglob("*.py")) + sorted((root / "demo").rglob("*.py")):
        if path.name == "state.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and sub.attr in INSTANCE_FIELDS and not _own(sub):
                        offenders.append(f"{path.name}:{node.lineno} writes .{sub.attr}")
            if isinstance(node, ast.Attribute) and node.attr in ("_instances", "_pairs", "_relays"):
                offenders.append(f"{path.name}:{node.lineno} reaches into .{node.attr}")
    assert not offenders, offenders


def _own(attr: ast.Attribute) -> bool:
    """`self.x = ...`: a class's own field, not an instance's."""
    return isinstance(attr.value, ast.Name) and attr.value.id == "self"
