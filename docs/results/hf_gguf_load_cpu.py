"""CPU seconds of transformers' own load of SmolLM2 from its GGUF file (the test suite's
reference, `tests/conftest.py smollm2_hf`), plain and with `_gguf_parsed_once` (one parse
of the file and one gguf tensor-name map for every call), and whether the two loads hold
the same tensors. One thread, as the suite runs. The first load also pays transformers'
imports, so the plain load is timed second.

Run (repo root): `.venv/bin/python docs/results/hf_gguf_load_cpu.py`. Prints JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from blitzscale.checkpoint import resolve_model
    from tests.conftest import _gguf_parsed_once

    torch.set_num_threads(1)
    path = resolve_model("smollm2-135m").path

    def load() -> object:
        return AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )

    t = time.process_time()
    with _gguf_parsed_once():
        load()  # (imports)
    cold = time.process_time() - t
    t = time.process_time()
    plain = load()
    plain_s = time.process_time() - t
    t = time.process_time()
    with _gguf_parsed_once():
        once = load()
    once_s = time.process_time() - t
    a, b = plain.state_dict(), once.state_dict()  # type: ignore[attr-defined]
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print(json.dumps({"first_load_with_imports_cpu_s": round(cold, 1), "plain_cpu_s": round(plain_s, 1),
                      "parsed_once_cpu_s": round(once_s, 1), "same_tensors": same}))  # fmt: skip


if __name__ == "__main__":
    main()
