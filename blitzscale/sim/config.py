"""Simulator presets (TOML files users copy and edit) and the models it knows."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from blitzscale.control.costmodel import Profile, load_profile, shipped_profile_path
from blitzscale.errors import BlitzScaleError
from blitzscale.sim.links import Topology
from blitzscale.tomlfile import read_toml

PRESETS_DIR = Path(__file__).parent / "presets"


class SimConfigError(BlitzScaleError, ValueError):
    """A preset or model the simulator cannot use (names the file or the value)."""


@dataclass(frozen=True)
class SimModel:
    name: str
    tp: int
    ttft_slo_s: float
    tbt_slo_s: float
    max_model_len: int
    profile_from: str = ""  # no profile of its own: scaled from this model's (sim/tp.py)


@dataclass(frozen=True)
class SimPreset:
    name: str
    topology: Topology
    device: str
    memory_bytes: float
    # every model's steps from this profile instead of `<model>-<device>` (one calibrated
    # to the machine at hand: `blitzscale bench fidelity`)
    profile_given: Profile | None = None

    def profile(self, model: str) -> Profile:
        """`<model>-<device>` from the shipped profiles (or `profile_given`), sized to this
        preset's device."""
        p = self.profile_given or load_profile(f"{model}-{self.device}")
        if p.device_memory_bytes != int(self.memory_bytes):
            p = replace(p, device_memory_bytes=int(self.memory_bytes))
        return p

    def instance_profile(self, model: SimModel) -> Profile:
        """What one of `model`'s instances (one shard of it, at TP > 1) takes a step: its
        own profile on this preset's device where one is shipped (measured), else one scaled
        from `profile_from`'s, split `tp` ways over this preset's link between GPUs of a node
        (sim/tp.py)."""
        from blitzscale.sim import tp

        own = not model.profile_from or shipped_profile_path(f"{model.name}-{self.device}").is_file()
        p = self.profile(model.name if own else model.profile_from)
        if not own:
            p = tp.scaled(p, model.name, tp.shape(model.name), tp.shape(model.profile_from))
        if model.tp > 1:
            t = self.topology
            link = t.nvlink_bytes_per_s or t.pcie_bytes_per_s
            p = tp.tensor_parallel(p, tp.shape(model.name), model.tp, link, t.latency_s)
        return replace(p, device_memory_bytes=int(self.memory_bytes))


def _section(d: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    sec = d.get(name)
    if not isinstance(sec, dict):
        raise SimConfigError(f"{where}: needs a [{name}] table")
    return sec


def load_preset(name_or_path: str) -> SimPreset:
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = PRESETS_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.toml") if p.stem != "models")
        raise SimConfigError(f"no preset {name_or_path!r}; shipped: {', '.join(known)}, or a .toml path")
    d = read_toml(path, f"--preset {path}")
    if extra := sorted(set(d) - {"topology", "device"}):
        raise SimConfigError(f"{path}: unknown section [{extra[0]}] (a preset has [topology] and [device])")
    topo, dev = _section(d, "topology", str(path)), _section(d, "device", str(path))
    ints = ("nodes", "gpus_per_node", "cores_per_node")
    for key, value in topo.items():  # (TOML's own types: no truncated 2.5, no "four")
        kind = (int,) if key in ints else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            what = "an integer" if key in ints else "a number"
            raise SimConfigError(f"{path} [topology] {key} must be {what}, got {value!r}")
    try:
        topology = Topology(**{k: (int(v) if k in ints else float(v)) for k, v in topo.items()})
    except (TypeError, ValueError) as e:
        raise SimConfigError(f"{path} [topology]: {e}") from e
    unknown = set(dev) - {"name", "memory_bytes"}
    if unknown or "name" not in dev or "memory_bytes" not in dev:
        raise SimConfigError(f"{path} [device] needs name and memory_bytes (unknown: {sorted(unknown)})")
    return SimPreset(path.stem, topology, str(dev["name"]), float(dev["memory_bytes"]))


def load_model(name: str) -> SimModel:
    models = read_toml(PRESETS_DIR / "models.toml", "the simulator's models.toml")
    if name not in models:
        raise SimConfigError(f"the simulator knows no model {name!r}; known: {', '.join(sorted(models))}")
    m = models[name]
    model = SimModel(
        name=name,
        tp=int(m.get("tp", 1)),
        ttft_slo_s=float(m["ttft_slo_s"]),
        tbt_slo_s=float(m["tbt_slo_s"]),
        max_model_len=int(m["max_model_len"]),
        profile_from=str(m.get("profile_from", "")),
    )
    if model.tp < 1:
        raise SimConfigError(f"model {name!r}: tp must be >= 1, got {model.tp}")
    return model
