"""`blitzscale batch TEMPLATE.toml`: run the cross product of models, traces, policies and
list-valued knobs that a template describes (format: blitzscale/batch/template.py), each on a
live local cluster (or, with --simulate PRESET, on the cluster simulator), then compare them.
Exit 0 when every run is done, 1 when some failed."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch", help="run a sweep of live experiments from a TOML template and compare them")
    p.add_argument("template", type=Path, help="batch template (see configs/batch.example.toml)")
    p.add_argument("--dry-run", action="store_true", help="list the runs, write their configs, run nothing")
    p.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="an earlier batch folder: its done runs are kept, the others run (--out defaults to DIR)",
    )
    p.add_argument("--out", type=Path, help="batch folder (default: DIR of --resume, else runs/batch/NAME)")
    p.add_argument(
        "--simulate",
        metavar="PRESET",
        help="run on the cluster simulator with this preset (paper-a, paper-b, h200x2, cpu4, or a .toml)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from blitzscale.batch.plan import expand
    from blitzscale.batch.report import comparison_table, plan_table
    from blitzscale.batch.runner import live_executor, run_batch, write_plan
    from blitzscale.batch.template import SIM_ONLY_POLICIES, load_template
    from blitzscale.errors import InvalidRequestError

    plan = expand(load_template(args.template))  # every check happens here, before anything runs
    execute = None
    if args.simulate:
        from blitzscale.sim.batch import check_plan, sim_executor

        execute = sim_executor(check_plan(plan, args.simulate))
    elif sized := sorted({r.policy for r in plan.runs if r.policy in SIM_ONLY_POLICIES}):
        raise InvalidRequestError(
            f"[experiment] policies: {', '.join(sized)} size themselves from blitz's peak in a "
            "simulated batch only (--simulate PRESET); a live batch takes `fixed` with "
            "[policy] fixed_prefill / fixed_decode"
        )
    else:  # a live run is a serve: the same checks, before any run starts (a dry run too)
        from blitzscale.serve.checks import check_serve_config

        for r in plan.runs:
            try:
                check_serve_config(r.cfg)
            except InvalidRequestError as e:
                raise InvalidRequestError(f"run {r.run_id}: {e}") from e
    if args.resume is not None and not args.resume.is_dir():
        raise InvalidRequestError(f"--resume {args.resume}: not a batch folder (no such directory)")
    out = args.out or args.resume or Path("runs/batch") / plan.name
    console = Console()
    console.print(plan_table(plan))
    if args.dry_run:
        write_plan(plan, out)
        console.print(f"dry run: configs of {len(plan.runs)} runs written to {out}/, nothing ran")
        return 0
    try:
        outcomes = run_batch(
            plan,
            out,
            execute or live_executor(console),
            resume=args.resume,
            log=lambda line: console.print(line, markup=False, highlight=False),
        )
    except KeyboardInterrupt:  # (the run under way stays "running": a resumed batch runs it again)
        again = f"blitzscale batch {args.template}{' --simulate ' + args.simulate if args.simulate else ''}"
        console.print(f"interrupted: the runs done are in {out}/; go on with `{again} --resume {out}`")
        raise
    if args.simulate:
        console.print(comparison_table(plan, outcomes, f"simulated on {args.simulate}, the model's SLOs"))
    else:
        console.print(comparison_table(plan, outcomes))
    failed = [o for o in outcomes if not o.is_done]
    console.print(
        f"{len(outcomes) - len(failed)}/{len(outcomes)} runs done; "
        f"{out}/comparison.csv, {out}/comparison.png, {out}/batch.json"
    )
    for o in failed:
        console.print(f"failed: {o.run.run_id}: {o.error}", markup=False, highlight=False)
    return 1 if failed else 0
