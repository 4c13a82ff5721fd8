"""The README and the docs pages say only what is true of the code: every relative link
leads to a file, and every `blitzscale` command in their shell blocks parses with the CLI's
own parser (its subcommand and every flag exist, every value is of the right kind). The
README's Python example runs against a live server in tests/serve/test_http.py."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from blitzscale.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
# The pages a user follows (docs/benchmarks.md records commands as they were run, in its
# own notation: `[--flag | --other]`, and those of other sessions' code).
PAGES = [ROOT / "README.md", *(ROOT / "docs" / f"{n}.md" for n in ("usage", "serving", "simulator", "ray"))]
LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _commands(page: Path) -> list[str]:
    """Each `blitzscale ...` line of the page's shell blocks, continuation lines joined,
    comments, redirections and pipes cut off."""
    out = []
    for lang, body in FENCE.findall(page.read_text()):
        if lang not in ("sh", "bash", ""):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            m = re.search(r"(?:^|\s|/)blitzscale\s+(.*)", line)
            if m is None or line.startswith("#") or "pip install" in line:
                continue
            rest = re.split(r"\s+(?:#|>|\||&)", " " + m.group(1))[0]
            out.append(rest.strip())
    return out


CASES = [(p.relative_to(ROOT).as_posix(), c) for p in PAGES for c in _commands(p)]


def test_the_pages_have_commands_to_check() -> None:
    pages = {p for p, _ in CASES}
    assert {"docs/usage.md", "docs/serving.md", "docs/simulator.md", "docs/ray.md", "README.md"} <= pages
    assert len(CASES) >= 25


@pytest.mark.parametrize(("page", "command"), CASES, ids=[f"{p}:{c[:40]}" for p, c in CASES])
def test_every_command_parses(page: str, command: str) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(shlex.split(command))
    except SystemExit as e:
        assert e.code == 0, f"{page}: `blitzscale {command}` does not parse: {err.getvalue().strip()}"


def test_every_relative_link_leads_to_a_file() -> None:
    for page in LINKED:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # (a web address)
            assert (page.parent / target).exists(), f"{page.name}: link to {target} leads nowhere"


def test_every_flag_says_what_it_does() -> None:
    """`blitzscale ... --help` explains every flag (a flag without help text was how
    `bench engine --prompt-len`, which nothing read any more, went unnoticed)."""
    bare = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])
            elif a.option_strings and a.help is None:
                bare.append(f"blitzscale {' '.join(path)} {a.option_strings[0]}")

    walk(build_parser(), [])
    assert not bare, bare
