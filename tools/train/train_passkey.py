#!/usr/bin/python3
"""Train a small Llama-architecture model that retrieves facts from far back in a long context.

Exact commands used for tools/models/passkey (CPU only, Debian's torch 1.13: only /usr/bin/python3
sees it; the run directory is resumable, rerun the same command to continue):

  # quick sanity run (a few minutes)
  nice -n 19 /usr/bin/python3 tools/train/train_passkey.py --run /tmp/pk_sanity --budget-min 4

  # the real run, in the background (stopped after 20.7 of the 30 minutes)
  nohup nice -n 19 /usr/bin/python3 tools/train/train_passkey.py --run tools/train/runs/c2 \
      --budget-min 30 > tools/train/runs/c2.log 2>&1 &

  # export the latest checkpoint to Hugging Face layout, then check it
  /usr/bin/python3 tools/train/train_passkey.py --run tools/train/runs/c2 --export tools/models/passkey
  /usr/bin/python3 tools/train/check_export.py tools/models/passkey

A fresh run starts from the hand-built induction circuit of construct_init.py (a random init did not
form induction heads within the CPU budget; see tools/models/passkey/MODEL_CARD.md) and fine-tunes it.
Tasks (passkey_lib.py): passkey in filler, multi-key "magic number for <name>" needles,
associative recall "k=v" lists, and a copy task. Loss: cross-entropy on answer tokens + 0.5 x copy
loss + 0.1 x LM loss on the rest (minus the unpredictable first copy of each number). The schedule
is driven by wall time, so contention changes the number of steps, not the curriculum's shape.
Long distances are taught by position jumps: inside the filler between the needle and the question
the position ids jump forward by a random amount (log-uniform up to 32k), so relative distances up
to 32k are seen while local positions stay contiguous.
"""

import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passkey_lib import (AR_INTRO, AR_KEYS, NAMES, NEEDLE_INTRO, NEEDLE_QUESTION, NEEDLE_TEXT,  # noqa
                         NUM_REGULAR, PAD_ID, PASSKEY_FILLER, PASSKEY_INTRO, PASSKEY_NEEDLE,
                         PASSKEY_QUESTION, Config, LlamaForCausalLM, Tokenizer, grammar_sentence,
                         make_ar, make_copy, make_needle, make_passkey, save_safetensors,
                         train_bpe)

MODEL_CONFIG = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                    rope_theta=1e12, max_position_embeddings=32768)
# (fraction of budget where the stage starts, seq len, batch)
CURRICULUM = [(0.0, 512, 8), (0.4, 1024, 4), (0.75, 2048, 2)]
TOKENIZER_SEED = 12345
EVAL_SEED_BASE = 900_000_000   # eval seeds live here; training seeds are < 100_000_000


def build_tokenizer():
    rng = random.Random(TOKENIZER_SEED)
    parts = [PASSKEY_INTRO, PASSKEY_FILLER * 3, PASSKEY_NEEDLE.format(k=12345), PASSKEY_QUESTION,
             NEEDLE_INTRO, AR_INTRO, "Questions:"]
    parts += [grammar_sentence(rng) for _ in range(3000)]
    # templates, names and keys often enough that (nearly) every word becomes one token
    parts += [PASSKEY_INTRO, PASSKEY_NEEDLE.format(k=1), PASSKEY_QUESTION, NEEDLE_INTRO] * 50
    parts += [NEEDLE_TEXT.format(name=n, n=1) + NEEDLE_QUESTION.format(name=n) for n in NAMES] * 20
    parts += [" " + k + "=12," for k in AR_KEYS] * 20
    parts += [" " + k for k in AR_KEYS + NAMES] * 20
    return Tokenizer(train_bpe("".join(parts), NUM_REGULAR - 256))


def make_sample(tok, rng, T, copy_frac=0.2):
    if rng.random() < copy_frac:
        return make_copy(tok, rng, min(T, 512))
    r = rng.random()
    if r < 0.25:
        return make_passkey(tok, rng, T, filler="repeat" if rng.random() < 0.7 else "grammar")
    if r < 0.6:
        return make_needle(tok, rng, T, n_questions=rng.randint(1, 3),
                           filler="grammar" if rng.random() < 0.7 else "repeat")
    return make_ar(tok, rng, T, n_questions=8)


def make_batch(tok, rng, T, B, max_pos, jump_prob=0.8, copy_frac=0.2):
    samples = [make_sample(tok, rng, T, copy_frac) for _ in range(B)]
    L = max(len(s.ids) for s in samples)
    ids = torch.full((B, L), PAD_ID, dtype=torch.long)
    wa = torch.zeros(B, L)   # answer targets
    wl = torch.zeros(B, L)   # LM targets
    wc = torch.zeros(B, L)   # copy-task targets
    pos = torch.zeros(B, L, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s.ids)
        ids[b, :n] = torch.tensor(s.ids)
        w = torch.tensor(s.weights)
        for a0, a1 in s.answers:
            wa[b, a0:a1] = 1.0
        wl[b, :n] = (w > 0) & (w < 1)
        for c0, c1 in s.copy_spans:
            wc[b, c0:c1] = 1.0
        p = torch.arange(L)
        room = max_pos - L - 1
        if rng.random() < jump_prob and s.jump_hi > s.jump_lo and room > 1:
            J = int(math.exp(rng.uniform(0, math.log(room))))
            at = rng.randint(s.jump_lo, s.jump_hi)
            p = p + J * (p >= at).long()
            room -= J
        p = p + rng.randint(0, max(0, room)) if rng.random() < 0.5 else p
        pos[b] = p
    return ids, pos, wa, wl, wc


def loss_fn(model, ids, pos, wa, wl, wc, lm_coef=0.1, copy_coef=0.5):
    logits = model(ids, pos)[:, :-1]
    tgt = ids[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                         reduction="none").view(tgt.shape)
    a, l = wa[:, 1:], wl[:, 1:]
    la = (ce * a).sum() / a.sum().clamp(min=1)
    ll = (ce * l).sum() / l.sum().clamp(min=1)
    c = wc[:, 1:]
    lc = (ce * c).sum() / c.sum().clamp(min=1)
    correct = (logits.argmax(-1) == tgt).float()
    tok_acc = (correct * a).sum() / a.sum().clamp(min=1)
    return la + lm_coef * ll + copy_coef * lc, la.item(), ll.item(), tok_acc.item(), lc.item()


@torch.no_grad()
def quick_eval(model, tok, lengths=(512, 1024, 2048), n=8):
    """Exact-match accuracy (teacher-forced argmax == greedy exact match) on unseen seeds."""
    model.eval()
    res = {}
    for T in lengths:
        for task in ("passkey", "needle"):
            ok = 0
            for i in range(n):
                rng = random.Random(EVAL_SEED_BASE + 7919 * T + i + (0 if task == "passkey" else 1 << 20))
                depth = i / max(1, n - 1)
                s = (make_passkey(tok, rng, T, depth) if task == "passkey"
                     else make_needle(tok, rng, T, depth, n_needles=4))
                a0, a1 = s.answers[0]
                ids = torch.tensor(s.ids[:a1])[None]
                pos = torch.arange(a1)[None]
                logits = model(ids, pos, logits_from=a0 - 1)
                pred = logits[0].argmax(-1)[: a1 - a0]
                ok += int(torch.equal(pred, ids[0, a0:a1]))
            res["%s@%d" % (task, T)] = ok / n
    model.train()
    return res


def export(model, tok, cfg, out_dir, meta=None):
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(out_dir, "model.safetensors"), sd)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.to_hf(), f, indent=2)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok.to_json(), f, indent=1, ensure_ascii=False)
    from passkey_lib import SPECIAL_TOKENS, BOS_ID, EOS_ID
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL_TOKENS[0],
          "eos_token": SPECIAL_TOKENS[1], "pad_token": SPECIAL_TOKENS[2], "add_bos_token": True,
          "add_eos_token": False, "clean_up_tokenization_spaces": False,
          "model_max_length": cfg.max_position_embeddings,
          "added_tokens_decoder": {str(BOS_ID + i): {"content": t, "lstrip": False,
                                                     "normalized": False, "rstrip": False,
                                                     "single_word": False, "special": True}
                                   for i, t in enumerate(SPECIAL_TOKENS)}}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
    if meta:
        with open(os.path.join(out_dir, "training_meta.json"), "w") as f:
            json.dump(meta, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="run directory (checkpoints, log CSV)")
    ap.add_argument("--budget-min", type=float, default=85.0, help="training wall time, minutes")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ckpt-every-s", type=float, default=180.0)
    ap.add_argument("--eval-every-s", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--export", default=None, help="export latest checkpoint here and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.run, exist_ok=True)
    ckpt_path = os.path.join(args.run, "ckpt.pt")

    tok = build_tokenizer()
    cfg = Config(**MODEL_CONFIG)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg)
    if not os.path.exists(ckpt_path):
        # start from the hand-built induction circuit (construct_init.py), calibrated on one sample
        import construct_init
        calib = make_needle(tok, random.Random(TOKENIZER_SEED), 512)
        construct_init.construct(model, seed=args.seed, sample_ids=torch.tensor(calib.ids)[None])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    step, elapsed = 0, 0.0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        print("resumed at step %d, %.1f min" % (step, elapsed / 60), flush=True)
    if args.export:
        export(model, tok, cfg, args.export,
               {"steps": step, "train_wall_min": round(elapsed / 60, 2), "seed": args.seed,
                "model_config": MODEL_CONFIG, "curriculum": CURRICULUM, "lr": args.lr})
        print("exported step %d to %s" % (step, args.export))
        return

    budget = args.budget_min * 60
    csv_path = os.path.join(args.run, "loss.csv")
    new_csv = not os.path.exists(csv_path)
    csv = open(csv_path, "a")
    if new_csv:
        csv.write("step,elapsed_min,seq_len,lr,loss_answer,loss_lm,answer_token_acc\n")
    last_ckpt = last_eval = time.time()
    t_prev = time.time()
    ema = None

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    while elapsed < budget:
        frac = elapsed / budget
        T, B = [(t, b) for f, t, b in CURRICULUM if f <= frac][-1]
        warm = min(1.0, frac / 0.03)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        rng = random.Random(args.seed * 1_000_000 + step)
        jump_prob = 0.8
        copy_frac = 0.2   # the copy task keeps the induction mechanism exercised
        # Bootstrap phase: until the copy loss shows working induction (EMA < 1.0), train on short
        # dense sequences (copy 60 %, then mostly associative recall).
        ids, pos, wa, wl, wc = make_batch(tok, rng, T, B, cfg.max_position_embeddings, jump_prob,
                                          copy_frac)
        loss, la, ll, acc, lc = loss_fn(model, ids, pos, wa, wl, wc)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        now = time.time()
        elapsed += now - t_prev
        t_prev = now
        ema = (la, ll, acc, lc) if ema is None else tuple(
            0.95 * e + 0.05 * x for e, x in zip(ema, (la, ll, acc, lc)))
        csv.write("%d,%.3f,%d,%.2e,%.4f,%.4f,%.4f\n" % (step, elapsed / 60, T, lr, la, ll, acc))
        if step % 10 == 0:
            csv.flush()
            print("step %d  %.1f min  T=%d  lr=%.1e  ans=%.3f lm=%.3f acc=%.3f copy=%.3f" %
                  ((step, elapsed / 60, T, lr) + ema), flush=True)
        if now - last_ckpt > args.ckpt_every_s:
            save()
            last_ckpt = now
        if now - last_eval > args.eval_every_s:
            t0 = time.time()
            print("eval step %d: %s" % (step, json.dumps(quick_eval(model, tok))), flush=True)
            last_eval = t_prev = time.time()   # eval time is not training time
            del t0
    save()
    csv.close()
    print("done: step %d, %.1f min" % (step, elapsed / 60))
    print("final eval: %s" % json.dumps(quick_eval(model, tok)), flush=True)


if __name__ == "__main__":
    main()
