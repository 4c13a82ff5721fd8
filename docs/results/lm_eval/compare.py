"""lm-evaluation-harness against `blitzscale serve`, checked by transformers.

lm-eval's `local-completions` scores each (context, continuation) of a multiple-choice task
by `echo` + `logprobs` requests (prompt logprobs); this recomputes each pair's
loglikelihood and greedy flag with transformers' own SmolLM2 (fp32, its GGUF reader) the
way lm-eval reads them from the server (the continuation's tokens after the context's
count), and prints one JSON object: the largest difference, the agreement of the greedy
flags, and both accuracies.

    python3 docs/results/lm_eval/compare.py OUTPUT_PATH TOKENIZER_DIR
(OUTPUT_PATH: lm-eval's `--output_path` of a `--log_samples` run of `tiny_mc`; run with the
repo's venv, whose transformers reads GGUF.)
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from blitzscale.checkpoint import resolve_model


def main(out_path: str, tokenizer_dir: str) -> None:
    gguf = resolve_model("smollm2-135m").path  # (the packaged GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    (samples,) = glob.glob(f"{out_path}/*/samples_tiny_mc_*.jsonl")[-1:]
    worst, pairs, greedy_agree, right_hf, right_server, docs = 0.0, 0, 0, 0, 0.0, 0
    for line in Path(samples).read_text().splitlines():
        s = json.loads(line)
        lls = []
        for args, resp in zip(s["arguments"].values(), s["resps"], strict=True):
            context, continuation = args["arg_0"], args["arg_1"]
            ids = tok(context + continuation).input_ids
            start = len(tok(context).input_ids)
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
            ll = sum(lp[p - 1, ids[p]].item() for p in range(start, len(ids)))
            greedy = all(int(lp[p - 1].argmax()) == ids[p] for p in range(start, len(ids)))
            worst = max(worst, abs(ll - float(resp[0][0])))
            greedy_agree += greedy == (resp[0][1] == "True")
            pairs += 1
            lls.append(ll)
        right_hf += max(range(len(lls)), key=lls.__getitem__) == s["doc"]["answer"]
        right_server += s["acc"]
        docs += 1
    print(
        json.dumps(
            {
                "pairs": pairs,
                "max_abs_loglikelihood_diff": worst,
                "is_greedy_agree": greedy_agree,
                "acc_server": right_server / docs,
                "acc_transformers": right_hf / docs,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
