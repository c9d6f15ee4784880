#!/usr/bin/python3
"""Runs eval_prompts.jsonl through our C++ engine (`icecache generate`, dense full KV, greedy) and
prints exact-match counts per (task, context), to compare with the torch results of
eval_passkey.py (tools/models/passkey/eval_full_kv.json, index-0 seeds).

  /usr/bin/python3 tools/train/check_engine.py BUILD/bin/icecache 1024,2048,4096,8192
"""

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    binary, ctxs = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    model = os.path.join(ROOT, "tools/models/passkey")
    rows = [json.loads(l) for l in open(os.path.join(model, "eval_prompts.jsonl"))]
    ok, t0 = {}, time.time()
    for r in rows:
        if r["context"] not in ctxs:
            continue
        out = subprocess.run(["nice", "-n", "19", binary, "generate", "--model", model,
                              "--prompt", r["prompt"], "--max-tokens", str(len(r["answer_ids"])),
                              "--output", "ids", "--threads", "1"], capture_output=True, text=True)
        if out.returncode != 0:
            print("error:", out.stderr.strip()[:300])
            ids = None
        else:
            ids = [int(x) for x in out.stdout.replace(",", " ").split()]
        good = ids == r["answer_ids"]
        ok.setdefault((r["task"], r["context"]), []).append(good)
        if not good:
            print("miss %s ctx=%d depth=%d got %s want %s" % (r["task"], r["context"], r["depth"],
                                                             ids, r["answer_ids"]))
    for k, v in sorted(ok.items()):
        print("%s ctx=%d: %d / %d" % (k[0], k[1], sum(v), len(v)))
    print("%.0f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
