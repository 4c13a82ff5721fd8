"""Bad paths and flag combinations on the command line: one line naming the problem and exit
code 2, before any work (a run's results are never lost to an unwritable `--out`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blitzscale.cli.main import main

SLICE = str(Path(__file__).parents[1] / "blitzscale" / "data" / "azure_code_2023_slice.csv")


@pytest.fixture
def in_the_way(tmp_path: Path) -> Path:
    """A file where a folder would have to be."""
    f = tmp_path / "file"
    f.write_text("x")
    return f


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["convert", "smollm2-135m", "{f}"], "cannot create the folder"),
        (["simulate", "--trace", SLICE, "--duration", "5", "--out", "{f}/sub"], "cannot create the folder"),
        (["replay", "--url", "http://127.0.0.1:9", "--gamma", "1,1", "--duration", "2", "--out", "{f}"],
         "cannot create the folder"),
        (["bench", "fidelity", "--sim-only", "--out", "{d}"], "is a folder"),
        (["profile", "--out", "{f}/p.json"], "cannot create the folder"),
        (["profile", "--derive", "smollm2-135m-cpu", "--steps", "9", "--batches", "1,2", "--out", "{d}/p"],
         "--derive measures nothing; drop --batches, --steps"),
        (["profile", "--derive", "smollm2-135m-cpu", "--device", "cuda", "--out", "{d}/p"],
         "--derive measures nothing; drop --device"),
        (["profile", "--flops-factor", "2", "--name", "x", "--out", "{d}/p.json"],
         "--flops-factor, --name only with --derive PROFILE"),
        (["generate", "--prompt", "Hi", "--system", "be brief"], "--system needs --chat"),
        (["tokenizer", "smollm2-135m", "{f}/tok"], "Not a directory"),  # (any path the CLI cannot use)
    ],
)  # fmt: skip
def test_refused_before_any_work(
    argv: list[str], says: str, in_the_way: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(f=in_the_way, d=in_the_way.parent) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err  # one line, no traceback
    assert in_the_way.read_text() == "x"


def test_an_out_file_in_a_folder_yet_to_be_made_is_written(tmp_path: Path) -> None:
    """(the check makes the missing folders and removes them again; the writer makes them)"""
    out = tmp_path / "new" / "deeper" / "p.json"
    argv = ["profile", "--derive", "smollm2-135m-cpu", "--bandwidth-factor", "2", "--flops-factor", "2"]
    argv += [
        "--memory-bytes",
        "1e9",
        "--name",
        "smollm2-135m-fast",
        "--device-name",
        "fast",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert out.is_file()


def test_generate_past_the_context_is_refused_as_the_api_refuses_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(It once generated until the context ran out: minutes on a CPU for a typo.)"""
    assert main(["generate", "--prompt", "Hi", "--max-tokens", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "--max-tokens is 100000000 but this model's context is 8192 tokens" in err and err.count("\n") == 1
