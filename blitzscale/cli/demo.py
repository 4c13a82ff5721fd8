"""`blitzscale demo`: for now, a generation with the default model (serving demo comes later)."""

from __future__ import annotations

import argparse

from blitzscale.checkpoint.resolve import DEFAULT_MODEL

DEMO_PROMPTS = ("The capital of France is", "What is the tallest mountain on Earth?")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the demo on the embedded default model")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console

    from blitzscale.cli.generate import encode_prompt
    from blitzscale.engine import LLMEngine, SamplingParams

    console = Console()
    with console.status(f"loading {args.model} on CPU"):
        t0 = time.perf_counter()
        engine = LLMEngine.from_model(args.model, device="cpu")
        load_s = time.perf_counter() - t0
    console.print(
        f"[bold]{args.model}[/] loaded in {load_s:.1f} s "
        f"({engine.pool.num_blocks} KV blocks of {engine.pool.block_size} tokens)"
    )
    prompts = [encode_prompt(engine.tokenizer, DEMO_PROMPTS[0], chat=False)]
    prompts += [encode_prompt(engine.tokenizer, p, chat=True) for p in DEMO_PROMPTS[1:]]
    params = SamplingParams(max_tokens=48, temperature=0)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    gen_s = time.perf_counter() - t0
    for prompt, out in zip(DEMO_PROMPTS, outs, strict=True):
        console.print(f"[cyan]{prompt}[/] -> {out.text.strip()!r} [dim]({out.finish_reason})[/]")
    n = sum(len(o.token_ids) for o in outs)
    console.print(f"{len(outs)} requests batched together, {n} tokens in {gen_s:.2f} s")
    return 0
