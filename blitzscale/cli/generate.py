"""`blitzscale generate`: one prompt through a local engine, streamed or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time

from blitzscale.checkpoint.resolve import DEFAULT_MODEL
from blitzscale.cli.common import add_device_arg, check_device
from blitzscale.errors import InvalidRequestError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with a local engine")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model name or path (default: %(default)s)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (%(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0: all)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampling (default: none)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens even past end-of-text")
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    p.set_defaults(func=run)


def encode_prompt(tokenizer, prompt: str, chat: bool, system: str | None = None) -> list[int]:
    if not prompt:
        raise InvalidRequestError("prompt is empty")
    if tokenizer is None:
        raise InvalidRequestError("this model has no tokenizer (random weights): text prompts need one")
    if not chat:
        return list(tokenizer(prompt).input_ids)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    from blitzscale.core.chat import render_chat

    return render_chat(tokenizer, messages)


def run(args: argparse.Namespace) -> int:
    from blitzscale.engine import LLMEngine, SamplingParams

    check_device(args.device)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
    params.validate()
    if not args.prompt:
        raise InvalidRequestError("prompt is empty")
    if args.system is not None and not args.chat:  # (a system message needs the chat template)
        raise InvalidRequestError("--system needs --chat")
    engine = LLMEngine.from_model(args.model, device=args.device)
    prompt_ids = encode_prompt(engine.tokenizer, args.prompt, args.chat, args.system)
    room = engine.max_model_len - len(prompt_ids)
    if args.max_tokens > room:  # (as the HTTP API: never cut short without saying)
        raise InvalidRequestError(
            f"--max-tokens is {args.max_tokens} but this model's context is {engine.max_model_len} tokens "
            f"and the prompt has {len(prompt_ids)}: at most {max(room, 0)} tokens can be generated"
        )
    start = time.perf_counter()
    first = None
    final = None
    for out in engine.stream(prompt_ids, params):
        first = first or time.perf_counter()
        if not args.json:
            sys.stdout.write(out.text_delta)
            sys.stdout.flush()
        final = out
    assert final is not None
    end = time.perf_counter()
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "text": final.text,
                    "token_ids": final.token_ids,
                    "prompt_token_ids": prompt_ids,
                    "finish_reason": final.finish_reason,
                    "usage": {
                        "prompt_tokens": len(prompt_ids),
                        "completion_tokens": len(final.token_ids),
                    },
                    "ttft_s": round((first or end) - start, 4),
                    "total_s": round(end - start, 4),
                }
            )
        )
    else:
        sys.stdout.write("\n")
    return 0
