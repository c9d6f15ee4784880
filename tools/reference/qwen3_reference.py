"""An independent fp32 torch implementation of Qwen3ForCausalLM's forward pass (and, with
qk_norm=False and optional attention biases, of the Llama/Qwen2 family), written from the
architecture description: RMSNorm, per-head RMSNorm of q and k before RoPE (rotate-half
convention), grouped-query causal softmax attention, SwiGLU MLP, tied or untied lm_head.
Only default RoPE (no scaling) is implemented; make_reference.py uses it for Qwen3 checkpoints.
"""
import json
import os

import torch
from safetensors.torch import save_file


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def weight_shapes(cfg):
    h, i, v, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], head_dim(cfg)
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (v, h)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nq * d, h), p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h), p + "self_attn.o_proj.weight": (h, nq * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        })
    return shapes


def save(out_dir, cfg, tensors):
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    # x: [heads, seq, d]; pairs dim i with i + d/2
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def forward(cfg, w, ids):
    """Logits [seq, vocab] for token ids [seq]; w maps HF tensor names to fp32 tensors."""
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    qk_norm = cfg.get("qk_norm", True)
    n = ids.shape[0]
    pos = torch.arange(n)
    x = w["model.embed_tokens.weight"][ids]
    mask = torch.full((n, n), float("-inf")).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name):
            y = h @ w[p + f"self_attn.{name}.weight"].T
            b = w.get(p + f"self_attn.{name}.bias")
            return y if b is None else y + b

        q = proj("q_proj").view(n, nq, d).transpose(0, 1)
        k = proj("k_proj").view(n, nkv, d).transpose(0, 1)
        v = proj("v_proj").view(n, nkv, d).transpose(0, 1)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        k = k.repeat_interleave(nq // nkv, dim=0)
        v = v.repeat_interleave(nq // nkv, dim=0)
        att = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5 + mask, dim=-1)
        o = (att @ v).transpose(0, 1).reshape(n, nq * d)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in w:
            x = x + w[p + "self_attn.o_proj.bias"]
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T
