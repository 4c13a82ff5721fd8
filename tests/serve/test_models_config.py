"""Several models in the cluster file (`[[models]]`) and on the command line (`--model
NAME=SOURCE`, `--keep-alive`): what is served, and bad values refused before any worker
starts with a message naming them."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from blitzscale.errors import BlitzScaleError
from blitzscale.serve.checks import check_serve_config
from blitzscale.serve.config import ModelEntry, ServeConfig, load_serve_config

CLI = [sys.executable, "-m", "blitzscale.cli.main"]

TWO = """
[model]
keep_alive_s = 60
[[models]]
name = "a"
source = "smollm2-135m"
[[models]]
name = "b"
source = "smollm2-135m"
min_instances = 1
max_instances = 2
keep_alive_s = 5
"""


def test_models_tables_are_served_in_order_with_the_default_keep_alive(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(TWO)
    cfg = load_serve_config(path)
    a, b = cfg.served_models()
    assert (a.name, a.spec, a.keep_alive_s, a.min_instances) == ("a", "smollm2-135m", 60.0, 0)
    assert (b.name, b.keep_alive_s, b.min_instances, b.max_instances) == ("b", 5.0, 1, 2)
    check_serve_config(cfg)
    # printed and loaded again: the same configuration
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml())
    assert load_serve_config(again) == cfg


def test_one_model_is_the_one_entry_case_and_never_scales_to_zero_by_default() -> None:
    (only,) = ServeConfig().served_models()
    assert (only.name, only.spec, only.tp, only.min_instances) == ("smollm2-135m", "smollm2-135m", 1, 0)
    assert math.isinf(only.keep_alive_s or 0)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (
            '[[models]]\nname = "a"\nsource = "no-such-model"\n',
            "[[models]] 'a' source: unknown model 'no-such-model'",
        ),
        ('[[models]]\nname = "a"\n[[models]]\nname = "a"\n', "the name 'a' is given twice"),
        (
            '[[models]]\nname = "a"\nmin_instances = 3\nmax_instances = 2\n',
            "min_instances=3 is more than max_instances=2",
        ),
        ('[[models]]\nname = "a"\nkeep_alive_s = -1\n', "keep_alive_s must be >= 0"),
        (
            '[[models]]\nname = "a"\nkeep_alive_s = "soon"\n',
            "keep_alive_s must be a number or unset, got 'soon'",
        ),
        ("[[models]]\nname = 3\n", "name must be a string, got 3 (int)"),
        ('[[models]]\nsource = "smollm2-135m"\n', "has no name"),
        ('[[models]]\nname = "a"\ncolour = "red"\n', "unknown key 'colour'"),
        ('[[models]]\nname = "a"\nmin_instances = 9\n', "min_instances=9 needs 9 workers, there are 3"),
        ('[[models]]\nname = "a"\nmax_instances = 1\n', "max_instances=1 cannot hold a prefill and a decode"),
        ('[[models]]\nname = "a"\ntp = 2\n', "tp=2, but every model has [model] tp=1"),
        ("[cluster]\nhost_memory_bytes = -1\n", "host_memory_bytes must be >= 0"),
        (
            '[policy]\nname = "fixed"\n[[models]]\nname = "a"\n[[models]]\nname = "b"\n',
            "policy 'fixed' never scales, so each of the 2 models needs its first instances at start: "
            "4 workers, there are 3",
        ),
    ],
)
def test_bad_models_are_named(tmp_path: Path, toml: str, needle: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(BlitzScaleError) as e:
        check_serve_config(load_serve_config(path))
    assert needle in str(e.value)


def test_model_flags_serve_several_models_and_a_bare_one_keeps_its_meaning() -> None:
    r = subprocess.run(
        [
            *CLI,
            "serve",
            "--model",
            "a=smollm2-135m",
            "--model",
            "b=smollm2-135m",
            "--keep-alive",
            "30",
            "--print-config",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "keep_alive_s = 30.0" in r.stdout
    assert r.stdout.count("[[models]]") == 2 and 'name = "b"' in r.stdout
    r = subprocess.run(
        [*CLI, "serve", "--model", "smollm2-135m", "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "[[models]]" not in r.stdout
    assert ServeConfig(models=(ModelEntry("x"),)).served_models()[0].spec == "x"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--model", "=smollm2-135m"], "--model '=smollm2-135m': expected NAME=SOURCE"),
        (["--model", "a="], "--model 'a=': expected NAME=SOURCE"),
        (["--model", "a=smollm2-135m", "--model", "a=smollm2-135m"], "the name 'a' is given twice"),
        (["--model", "a=nope", "--model", "b=smollm2-135m"], "[[models]] 'a' source: unknown model 'nope'"),
        (["--keep-alive", "-2"], "keep_alive_s must be >= 0"),
        (["--workers", "100000"], "num_workers = 100000: each CPU worker holds a model's weights"),
    ],
)
def test_bad_model_flags_are_refused_before_any_worker_starts(flags: list[str], needle: str) -> None:
    r = subprocess.run([*CLI, "serve", *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr


def test_each_model_plans_for_its_ttft_slo_or_the_default_one() -> None:
    """`[model] ttft_slo_s` (`--ttft-slo`) is every model's, a `[[models]]` entry's its own:
    the scaler's view of the model carries it (the planner's band follows it)."""
    from blitzscale.serve.server import _scaled_model

    cfg = ServeConfig().with_overrides(model={"ttft_slo_s": 0.5})
    assert _scaled_model(ModelEntry("a"), "f", cfg).ttft_slo_s == 0.5
    assert _scaled_model(ModelEntry("b", ttft_slo_s=2.0), "f", cfg).ttft_slo_s == 2.0
    assert _scaled_model(ModelEntry("c"), "f", ServeConfig()).ttft_slo_s == 0.0  # none: the default band
