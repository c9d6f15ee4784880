#!/usr/bin/python3
"""Accuracy of the passkey model per context length and needle depth, on seeds never used in training.

Exact commands (torch 1.13 is visible only to /usr/bin/python3):

  # exported model (Hugging Face layout), full KV, plain torch
  nice -n 19 /usr/bin/python3 tools/train/eval_passkey.py --model tools/models/passkey \
      --tasks passkey,needle --contexts 1k,2k,4k,8k --depths 0,25,50,75,100 --n 4 \
      --json /tmp/acc.json

  # a training checkpoint (during a run)
  nice -n 19 /usr/bin/python3 tools/train/eval_passkey.py --ckpt tools/train/runs/main/ckpt.pt ...

Scoring: the prompt is fed once with the expected answer appended (teacher forcing); a sample is
correct iff the argmax at every answer position equals the expected token, which is exactly
"greedy decoding of len(answer) tokens reproduces the answer". Training seeds are < 1e8; eval seeds
are EVAL_SEED_BASE (9e8) + context*1e5 + depth%*100 + index (+5e4 for the needle task).
Also reports, per layer, the mean attention mass that the last prompt token puts on the needle.
"""

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passkey_lib import (Config, LlamaForCausalLM, load_model_dir, make_ar, make_needle,  # noqa
                         make_passkey)
import train_passkey as tp  # noqa


def parse_ctx(s):
    s = s.strip().lower()
    return int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)


def sample_for(tok, task, T, depth, i, n_needles):
    seed = (tp.EVAL_SEED_BASE + T * 100_000 + int(round(depth * 100)) * 100 + i
            + (0 if task == "passkey" else 50_000))
    rng = random.Random(seed)
    if task == "passkey":
        return make_passkey(tok, rng, T, depth), seed
    if task == "ar":   # associative recall: as many pairs as fit (at most 116); depth unused
        return make_ar(tok, rng, T, n_questions=1), seed
    return make_needle(tok, rng, T, depth, n_needles=n_needles), seed


@torch.no_grad()
def score(model, s, q_chunk):
    a0, a1 = s.answers[0]
    ids = torch.tensor(s.ids[:a1])[None]
    pos = torch.arange(a1)[None]
    probe = {"row": a0 - 1, "out": []}
    logits = model(ids, pos, q_chunk=q_chunk if a1 > q_chunk else None, probe=probe,
                   logits_from=a0 - 1)
    pred = logits[0].argmax(-1)[: a1 - a0]
    ok = bool(torch.equal(pred, ids[0, a0:a1]))
    n0, n1 = s.meta.get("needle_span", (0, 0))
    mass = [float(p[0, :, n0:n1].sum(-1).max()) for p in probe["out"]]  # best head per layer
    return ok, pred.tolist(), mass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="HF-layout model directory")
    ap.add_argument("--ckpt", help="training checkpoint (ckpt.pt)")
    ap.add_argument("--tasks", default="passkey,needle", help="passkey, needle, ar")
    ap.add_argument("--contexts", default="1k,2k,4k,8k")
    ap.add_argument("--depths", default="0,25,50,75,100", help="percent")
    ap.add_argument("--n", type=int, default=4, help="samples per (task, context, depth)")
    ap.add_argument("--needles", type=int, default=4, help="needles in the needle task")
    ap.add_argument("--q-chunk", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        model, tok = load_model_dir(args.model)
    else:
        tok = tp.build_tokenizer()
        model = LlamaForCausalLM(Config(**tp.MODEL_CONFIG))
        model.load_state_dict(torch.load(args.ckpt)["model"])
    model.eval()
    depths = [float(d) / 100 for d in args.depths.split(",")]
    rows = []
    t_start = time.time()
    for task in args.tasks.split(","):
        for cs in args.contexts.split(","):
            T = parse_ctx(cs)
            ok_t, mass_t, t0 = 0, None, time.time()
            per_depth = []
            for d in depths:
                ok_d = 0
                for i in range(args.n):
                    s, seed = sample_for(tok, task, T, d, i, args.needles)
                    ok, pred, mass = score(model, s, args.q_chunk)
                    ok_d += ok
                    mass_t = mass if mass_t is None else [a + b for a, b in zip(mass_t, mass)]
                    rows.append({"task": task, "context": T, "tokens": len(s.ids), "depth": d,
                                 "seed": seed, "correct": ok})
                per_depth.append(ok_d / args.n)
                ok_t += ok_d
            cnt = len(depths) * args.n
            print("%-8s ctx=%6d  acc=%.3f  per-depth=%s  needle-attn/layer=%s  (%.0fs)" % (
                task, T, ok_t / cnt, [round(x, 2) for x in per_depth],
                [round(m / cnt, 3) for m in mass_t], time.time() - t0), flush=True)
    summary = {}
    for r in rows:
        k = "%s@%d" % (r["task"], r["context"])
        summary.setdefault(k, []).append(r["correct"])
    summary = {k: sum(v) / len(v) for k, v in summary.items()}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows, "args": vars(args),
                       "wall_s": time.time() - t_start}, f, indent=1)


if __name__ == "__main__":
    main()
