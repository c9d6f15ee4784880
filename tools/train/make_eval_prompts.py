#!/usr/bin/python3
"""Writes the evaluation prompts as JSON lines, so non-Python harnesses (icecache-bench accuracy)
use exactly the prompts that eval_passkey.py scores.

  /usr/bin/python3 tools/train/make_eval_prompts.py --model tools/models/passkey \
      --out tools/models/passkey/eval_prompts.jsonl --contexts 1k,2k,4k,8k \
      --depths 0,25,50,75,100 --n 1

One line per sample: {"task", "context", "depth" (percent), "index", "seed", "prompt" (text, to be
encoded WITH the bos token, i.e. add_special_tokens=true), "prompt_ids" (ids incl. bos, for
checking a tokenizer), "answer" (text), "answer_ids", "needle_token_span" [start, end)}.
Scoring: greedy-decode len(answer_ids) tokens; correct iff they equal answer_ids.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_passkey import parse_ctx, sample_for  # noqa
from passkey_lib import load_model_dir  # noqa


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", default="passkey,needle")
    ap.add_argument("--contexts", default="1k,2k,4k,8k")
    ap.add_argument("--depths", default="0,25,50,75,100")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--needles", type=int, default=4)
    args = ap.parse_args()
    _, tok = load_model_dir(args.model)
    n = 0
    with open(args.out, "w") as f:
        for task in args.tasks.split(","):
            for cs in args.contexts.split(","):
                T = parse_ctx(cs)
                for d in args.depths.split(","):
                    for i in range(args.n):
                        s, seed = sample_for(tok, task, T, float(d) / 100, i, args.needles)
                        a0, a1 = s.answers[0]
                        f.write(json.dumps({
                            "task": task, "context": T, "depth": int(d), "index": i, "seed": seed,
                            "prompt": tok.decode(s.ids[1:a0]), "prompt_ids": s.ids[:a0],
                            "answer": tok.decode(s.ids[a0:a1]), "answer_ids": s.ids[a0:a1],
                            "needle_token_span": list(s.meta["needle_span"])}) + "\n")
                        n += 1
    print("wrote %d prompts to %s" % (n, args.out))


if __name__ == "__main__":
    main()
