"""Prompts built from Mooncake's prefix-block hashes: shared leading ids, shared leading tokens."""

import json
import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from blitzscale.client.cli import main
from blitzscale.client.protocols import (
    HASH_WORDS,
    SALT_DIGITS,
    SALT_FIRST_ID,
    hashed_prompt,
    hashed_prompt_ids,
    request_for,
)
from blitzscale.client.replay import ReplayConfig

from .fake_server import FakeServer

StartServer = Callable[..., AbstractContextManager[FakeServer]]


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_shared_leading_ids_share_exactly_those_blocks_of_token_ids() -> None:
    a = hashed_prompt_ids(16 * 4, [7, 8, 9, 10], 16, salt=1)
    b = hashed_prompt_ids(16 * 4 - 5, [7, 8, 9, 11], 16, salt=2)
    assert (len(a), len(b)) == (64, 59)
    assert common_prefix(a, b) == 48  # the salt plays no part; block 4 differs at once
    assert hashed_prompt_ids(64, [3, 4, 5, 6], 16) != hashed_prompt_ids(64, [7, 8, 9, 10], 16)
    assert common_prefix(a, hashed_prompt_ids(64, [8, 9, 10, 11], 16)) == 0


def test_a_block_depends_on_its_id_only() -> None:
    rng = random.Random(0)
    for _ in range(200):
        block = rng.choice([1, 3, 16, 32, 100])
        shared = [rng.randrange(10**7) for _ in range(rng.randrange(0, 5))]
        tail_a = [rng.randrange(10**7) for _ in range(3)]
        tail_b = [rng.randrange(10**7) for _ in range(3)]
        if tail_a[0] == tail_b[0]:
            continue
        a = hashed_prompt_ids(block * 5, shared + tail_a, block)
        b = hashed_prompt_ids(block * 5, shared + tail_b, block)
        n = common_prefix(a, b)
        assert len(shared) * block <= n < (len(shared) + 1) * block
        # the same id gives the same block wherever it stands
        assert hashed_prompt_ids(block, [tail_a[0]], block) == a[len(shared) * block :][:block]


def test_distinct_ids_give_distinct_blocks_of_six_tokens_or_more() -> None:
    blocks = {tuple(hashed_prompt_ids(6, [h], 6)) for h in range(5000)}
    assert len(blocks) == 5000
    assert {tuple(hashed_prompt_ids(2, [h], 2)) for h in range(256 * 256)}.__len__() == 256 * 256
    assert all(SALT_FIRST_ID <= t < SALT_FIRST_ID + 256 for t in hashed_prompt_ids(512, [2**40, 5], 256))


def test_prompt_is_cut_to_the_input_length_and_salted_past_the_last_block() -> None:
    assert len(hashed_prompt_ids(20, [1, 2], 16)) == 20  # the last block partial
    long = hashed_prompt_ids(40, [1, 2], 16, salt=3)
    assert len(long) == 40 and long[:32] == hashed_prompt_ids(32, [1, 2], 16)
    assert long[32 : 32 + SALT_DIGITS] == [SALT_FIRST_ID] * (SALT_DIGITS - 1) + [SALT_FIRST_ID + 3]
    assert len(hashed_prompt_ids(0, [1], 16)) == 1
    with pytest.raises(ValueError, match="block_tokens must be >= 1, got 0"):
        hashed_prompt_ids(4, [1], 0)


def test_text_prompt_shares_exactly_the_tokens_of_shared_blocks(smollm2_tokenizer: Any) -> None:
    """Checked with SmolLM2's own tokenizer: one token per word, so blocks are token runs."""
    tok = smollm2_tokenizer
    assert all(len(tok.encode(" " + w, add_special_tokens=False)) == 1 for w in HASH_WORDS)
    a_text = hashed_prompt(16 * 5, [40, 41, 42, 43, 44], 16, salt=1)
    b_text = hashed_prompt(16 * 5, [40, 41, 42, 50, 51], 16, salt=2)
    a, b = tok.encode(a_text), tok.encode(b_text)
    assert (len(a), len(b)) == (80, 80) == (len(a_text.split()), len(b_text.split()))
    assert common_prefix(a, b) == 48
    # and the shared run is the same tokens as the prompt of those blocks alone
    assert tok.encode(hashed_prompt(48, [40, 41, 42], 16)) == a[:48]
    rng = random.Random(1)
    for _ in range(20):
        shared = [rng.randrange(10**6) for _ in range(rng.randrange(0, 4))]
        x = tok.encode(hashed_prompt(96, [*shared, 1, 2, 3, 4, 5, 6], 16))
        y = tok.encode(hashed_prompt(96, [*shared, 7, 8, 9, 10, 11, 12], 16))
        assert len(shared) * 16 <= common_prefix(x, y) < (len(shared) + 1) * 16
        assert len(x) == len(y) == 96


def test_requests_without_hash_ids_keep_their_salt_and_with_them_drop_it() -> None:
    plain = [request_for("openai", None, 8, 1, salt=s)[1]["prompt"] for s in (0, 1)]
    assert plain[0].split()[0] == "#0" and plain[1].split()[0] == "#1"
    ids = [request_for("openai", None, 8, 1, token_ids=True, salt=s)[1]["prompt"] for s in (0, 1)]
    assert ids[0] != ids[1]
    hashed = [request_for("openai", None, 30, 1, salt=s, hash_ids=(5, 6), block_tokens=16) for s in (0, 1)]
    assert hashed[0] == hashed[1]
    assert hashed[0][1]["prompt"] == hashed_prompt(30, (5, 6), 16) and "#" not in hashed[0][1]["prompt"]
    tgi = request_for("tgi", None, 30, 1, salt=3, hash_ids=(5, 6), block_tokens=16)[1]["inputs"]
    assert tgi == hashed[0][1]["prompt"]
    with pytest.raises(ValueError, match="hash_block_tokens must be >= 1"):
        ReplayConfig(url="http://x:1", hash_block_tokens=0)


def test_replay_scales_lengths_and_shares_prefixes(fake_server: StartServer, tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 2, "hash_ids": [0, 1, 2]},
        {"timestamp": 10, "input_length": 1100, "output_length": 2, "hash_ids": [0, 1, 3]},
        {"timestamp": 20, "input_length": 40, "output_length": 2},
    ]
    trace = tmp_path / "m.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with fake_server() as server:
        argv = [
            "--url",
            server.url,
            "--trace",
            str(trace),
            "--format",
            "mooncake",
            "--hash-block-tokens",
            "16",
        ]
        assert main([*argv, "--max-input", "45", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
        prompts = [r.body["prompt"].split() for r in sorted(server.received, key=lambda r: r.time)]
    # 1500 * 16/512 = 46.875 -> 47, then clamped to 45; 1100 -> 34.375 -> 35; no ids: unscaled 40
    assert [len(p) for p in prompts] == [45, 35, 40]
    assert common_prefix(prompts[0], prompts[1]) >= 32 and prompts[0][32] != prompts[1][32]
    assert prompts[2][0] == "#2"
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["options"]["hash_block_tokens"] == 16
