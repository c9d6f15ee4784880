#!/usr/bin/python3
"""Writes the tiny reference checkpoints and their expected logits under tests/fixtures/models/.

Run once with Debian's Python (torch 1.13) plus transformers 4.48.3 (4.47.1 gives bit-identical
logits) and safetensors:
  /usr/bin/python3 -m pip install --break-system-packages 'transformers==4.48.3' safetensors
  /usr/bin/python3 tools/reference/make_reference.py [--out tests/fixtures/models]

Llama, Mistral and Qwen2 checkpoints are written by transformers' own save_pretrained and their
logits computed by transformers (eager attention, fp32 compute on the stored weights).
transformers 4.48 is the newest release that imports with torch 1.13 and it has no Qwen3
(added in 4.51, which needs torch >= 2), so Qwen3 checkpoints are written with safetensors and
their logits come from qwen3_reference.py, an independent torch implementation that this script
first checks against transformers' Llama on the Llama cases (q/k norm switched off).
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_reference  # noqa: E402

VOCAB = 300
HIDDEN = 64
LAYERS = 2
INTERMEDIATE = 96
SEQ = 20
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

# name, architecture, extra config, weight dtype, shard size (None = one file)
CASES = [
    ("llama_gqa_f32", "llama", dict(num_attention_heads=4, num_key_value_heads=2), "f32", None),
    ("llama3_scaling_tied_bf16_sharded", "llama",
     dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=64)), "bf16", "150KB"),
    ("llama_linear_mha_f32", "llama",
     dict(num_attention_heads=4, num_key_value_heads=4, rope_scaling=dict(type="linear", factor=2.5)), "f32", None),
    ("mistral_gqa_f16", "mistral", dict(num_attention_heads=8, num_key_value_heads=2, sliding_window=None), "f16", None),
    ("qwen2_bias_tied_f32", "qwen2", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                           rope_theta=1000000.0), "f32", None),
    ("qwen2_bias_bf16", "qwen2", dict(num_attention_heads=4, num_key_value_heads=2), "bf16", None),
    ("qwen3_qknorm_headdim32_f32", "qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32), "f32", None),
    ("qwen3_qknorm_tied_bf16", "qwen3", dict(num_attention_heads=8, num_key_value_heads=4, head_dim=24,
                                             tie_word_embeddings=True), "bf16", None),
    ("llama_attention_bias_f32", "llama", dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True),
     "f32", None),
]

HF = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
      "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def base_config(extra):
    cfg = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
               max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1,
               tie_word_embeddings=False, hidden_act="silu")
    cfg.update(extra)
    return cfg


def randomize(state, gen):
    """Weights with std large enough that logits are far from uniform."""
    out = {}
    for name, t in state.items():
        if name.endswith("norm.weight") or "layernorm" in name:
            out[name] = 1.0 + 0.2 * torch.randn(t.shape, generator=gen)
        elif name.endswith(".bias"):
            out[name] = 0.2 * torch.randn(t.shape, generator=gen)
        else:
            out[name] = 0.15 * torch.randn(t.shape, generator=gen)
    return out


def hf_case(name, arch, extra, dtype, shard, out_dir, ids, gen):
    cfg_cls, model_cls = HF[arch]
    config = cfg_cls(**base_config(extra))
    model = model_cls(config).eval()
    state = randomize(model.state_dict(), gen)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    model = model.to(DTYPES[dtype])
    kwargs = dict(safe_serialization=True)
    if shard:
        kwargs["max_shard_size"] = shard
    model.save_pretrained(out_dir, **kwargs)
    ref = model_cls.from_pretrained(out_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0]
    return logits, ref


def qwen3_case(name, extra, dtype, out_dir, ids, gen):
    cfg = base_config(extra)
    cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False,
               use_sliding_window=False, rope_theta=1000000.0, torch_dtype={"f32": "float32", "bf16": "bfloat16"}[dtype])
    shapes = qwen3_reference.weight_shapes(cfg)
    state = randomize({k: torch.empty(s) for k, s in shapes.items()}, gen)
    stored = {k: v.to(DTYPES[dtype]).contiguous() for k, v in state.items()}
    os.makedirs(out_dir, exist_ok=True)
    qwen3_reference.save(out_dir, cfg, stored)
    with torch.no_grad():
        logits = qwen3_reference.forward(cfg, {k: v.float() for k, v in stored.items()}, torch.tensor(ids))
    return logits


def check_independent_reference(hf_model, ids):
    """The Qwen3 reference with q/k norm off must reproduce transformers' Llama."""
    cfg = hf_model.config.to_dict()
    cfg["qk_norm"] = False
    state = {k: v.float() for k, v in hf_model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.no_grad():
        mine = qwen3_reference.forward(cfg, state, torch.tensor(ids))
        theirs = hf_model(torch.tensor([ids])).logits[0]
    err = (mine - theirs).abs().max().item() / theirs.abs().max().item()
    if err > 1e-5:
        raise SystemExit(f"independent reference disagrees with transformers: rel err {err}")
    return err


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "models"))
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, VOCAB, (SEQ,), generator=gen).tolist()
    summary = []
    for name, arch, extra, dtype, shard in CASES:
        out_dir = os.path.join(args.out, name)
        shutil.rmtree(out_dir, ignore_errors=True)
        if arch == "qwen3":
            logits = qwen3_case(name, extra, dtype, out_dir, ids, gen)
            source = "tools/reference/qwen3_reference.py (independent torch implementation)"
        else:
            logits, ref = hf_case(name, arch, extra, dtype, shard, out_dir, ids, gen)
            source = f"transformers {transformers.__version__} {HF[arch][1].__name__}, eager, fp32"
            if arch == "llama" and "rope_scaling" not in extra:
                err = check_independent_reference(ref, ids)
                print(f"  qwen3_reference.py vs transformers on {name}: max rel err {err:.2e}")
        expected = {"case": name, "source": source, "torch": torch.__version__, "ids": ids,
                    "logits": [[float(f"{x:.6g}") for x in row] for row in logits.tolist()]}
        with open(os.path.join(out_dir, "expected_logits.json"), "w") as f:
            json.dump(expected, f, separators=(",", ":"))
            f.write("\n")
        summary.append(name)
        print(f"{name}: {logits.shape[0]}x{logits.shape[1]} logits, max |logit| {logits.abs().max().item():.3f}, "
              f"std {logits.std().item():.3f}")
    with open(os.path.join(args.out, "cases.txt"), "w") as f:
        f.write("\n".join(summary) + "\n")


if __name__ == "__main__":
    main()
