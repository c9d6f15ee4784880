#!/usr/bin/env python3
"""Writes the GGUF test fixtures of tests/fixtures/gguf/ with PyPI's `gguf` package (the writer and
reference dequantiser that llama.cpp's Python tools use), so icecache's own parser and dequantiser
are checked against an independent implementation. Run once; the outputs are committed:

  /usr/bin/python3 -m pip install --break-system-packages gguf safetensors
  /usr/bin/python3 tools/gguf/make_gguf_fixtures.py tests/fixtures/gguf

Outputs:
  dequant.gguf            one [4, 256] tensor per supported type (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K
                          Q5_K Q6_K); quantised blocks are random bytes with finite scales
  dequant_reference.f32   gguf.quants.dequantize of each, little-endian f32, in the same order
  dequant_q5.gguf, dequant_q5_reference.f32  the same for Q5_0 and Q5_1 (added later, its own
                          random stream: the files above did not change)
  tiny_llama.gguf         a 2-layer llama (hidden 256, 4 q / 2 kv heads, head_dim 64, vocab 300)
                          whose weights use every type, q/k stored row-permuted as llama.cpp's
                          converter does, with a gpt2 byte-level tokenizer (pre "smollm") and a
                          ChatML template
  tiny_qwen2.gguf, tiny_qwen3.gguf (+ _hf/)  1-layer Qwen2 (q/k/v biases) and Qwen3 (q/k norms,
                          2 heads of 64 != hidden / heads) variants, stored unpermuted as llama.cpp does
  tiny_llama_hf/          the same model as a Hugging Face directory: config.json and
                          model.safetensors holding gguf.quants.dequantize's weights un-permuted,
                          rounded to bf16 (nearest even) for quantised tensors, as stored otherwise
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

RNG = np.random.default_rng(20261201)

# Block bytes and the offsets of the fp16 scale fields (d and where present dmin/m).
BLOCK = {
    T.Q8_0: (32, 34, [0]),
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
}


def random_blocks(qtype, rows, cols, scale, rng=RNG):
    """Random quantised rows: random bytes, fp16 scale fields set to finite values ~ scale."""
    values, nbytes, scale_offsets = BLOCK[qtype]
    nblocks = rows * cols // values
    raw = rng.integers(0, 256, size=(nblocks, nbytes), dtype=np.uint8)
    for off in scale_offsets:
        s = (rng.standard_normal(nblocks) * scale).astype(np.float16)
        if qtype in (T.Q4_1, T.Q5_1) and off == 2:  # the min: centre the values
            half = 8 if qtype == T.Q4_1 else 16
            s = (-half * np.abs(raw[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32))).astype(np.float16)
        raw[:, off:off + 2] = s.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(rows, cols // values * nbytes)


def plain(qtype, rows, cols, scale):
    x = (RNG.standard_normal((rows, cols)) * scale).astype(np.float32)
    if qtype == T.F32:
        return x, x
    if qtype == T.F16:
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    # BF16: nearest-even from f32, stored as uint16 bits
    q = gguf.quants.quantize(x, T.BF16)
    return q, gguf.quants.dequantize(q, T.BF16)


def tensor(qtype, rows, cols, scale):
    """(array to write, its f32 dequantisation)."""
    if qtype in (T.F32, T.F16, T.BF16):
        return plain(qtype, rows, cols, scale)
    raw = random_blocks(qtype, rows, cols, scale)
    return raw, gguf.quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)


def bf16_round(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def add(writer, name, arr, qtype):
    if qtype in (T.F32, T.F16):
        writer.add_tensor(name, arr)
    else:
        writer.add_tensor(name, arr, raw_dtype=qtype)


def write_dequant(out):
    types = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K]
    w = gguf.GGUFWriter(os.path.join(out, "dequant.gguf"), "llama")
    refs = []
    for t in types:
        arr, ref = tensor(t, 4, 256, 1.0)
        add(w, t.name.lower(), arr, t)
        refs.append(ref.reshape(-1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    np.concatenate(refs).astype("<f4").tofile(os.path.join(out, "dequant_reference.f32"))


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tiny_llama(out, arch="llama"):
    H, I, L, NH, NKV, HD = 256, 256, 2, 4, 2, 64
    if arch == "qwen3":
        L, NH = 1, 2  # q dim 128 != hidden: head_dim comes from attention.key_length
    elif arch == "qwen2":
        L = 1
    b2u = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in range(256)]
    types = [3, 3, 3] + [1] * 256
    merge_pairs = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s"),
                   ("e", "s"), ("Ġ", "w"), ("a", "t"), ("Ġ", "c"), ("i", "s"), ("o", "r"), ("e", "n"), ("Ġ", "o"),
                   ("Ġ", "b"), ("Ġ", "f"), ("a", "n"), ("Ġ", "m"), ("e", "d"), ("Ġ", "p"), ("i", "t"), ("a", "r"),
                   ("Ġ", "d"), ("l", "l"), ("Ġ", "h"), ("Ġ", "i"), ("o", "u"), ("r", "e"), ("Ġ", "1"), ("Ġ", "2"),
                   ("in", "g"), ("Ġ", "l"), ("Ġ", "n"), ("a", "l"), ("Ġ", "e"), ("Ġ", "g"), ("i", "c"), ("o", "m"),
                   ("Ġw", "h")]
    merges = []
    for a, b in merge_pairs:
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
        merges.append(a + " " + b)
    V = len(tokens)
    assert V == 300, V
    template = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
                "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

    name = "tiny_llama" if arch == "llama" else "tiny_" + arch
    w = gguf.GGUFWriter(os.path.join(out, name + ".gguf"), arch)
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_rope_dimension_count(HD)
    if arch == "qwen3":
        w.add_key_length(HD)
        w.add_value_length(HD)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(template)

    hf = {}

    def put(gname, hname, qtype, rows, cols, scale, perm_heads=None):
        arr, deq = tensor(qtype, rows, cols, scale)
        add(w, gname, arr, qtype)
        if perm_heads is not None and arch == "llama":  # GGUF row h*hd + 2i + j  is HF row h*hd + j*hd/2 + i
            g = deq.reshape(perm_heads, HD // 2, 2, cols)
            deq = g.transpose(0, 2, 1, 3).reshape(rows, cols)
        if qtype in (T.F32, T.F16, T.BF16):
            hf[hname] = deq.astype(np.float32) if qtype == T.F32 else (
                deq.astype(np.float16) if qtype == T.F16 else None)
            if qtype == T.BF16:
                hf[hname] = ("bf16", bf16_round(deq))
        else:
            hf[hname] = ("bf16", bf16_round(deq))

    def put_norm(gname, hname):
        x = (1.0 + 0.1 * RNG.standard_normal(H)).astype(np.float32)
        w.add_tensor(gname, x)
        hf[hname] = x

    put("token_embd.weight", "model.embed_tokens.weight", T.Q8_0, V, H, 0.01)
    layer_types = [
        dict(q=T.Q4_K, k=T.Q5_K, v=T.Q6_K, o=T.Q8_0, gate=T.Q4_0, up=T.Q4_1, down=T.F16),
        dict(q=T.BF16, k=T.Q4_0, v=T.F32, o=T.Q4_K, gate=T.Q5_K, up=T.Q6_K, down=T.Q8_0),
    ][:L]
    for l, ty in enumerate(layer_types):
        p, hp = f"blk.{l}.", f"model.layers.{l}."
        put_norm(p + "attn_norm.weight", hp + "input_layernorm.weight")
        # K-quant scales: values d * scale(<64) * q(<32); keep weights ~ 0.05.
        s = lambda t: (0.05 if t in (T.F32, T.F16, T.BF16) else 1e-4 if t in (T.Q4_K, T.Q5_K, T.Q6_K)
                       else 5e-4 if t == T.Q8_0 else 0.006)
        put(p + "attn_q.weight", hp + "self_attn.q_proj.weight", ty["q"], NH * HD, H, s(ty["q"]), NH)
        put(p + "attn_k.weight", hp + "self_attn.k_proj.weight", ty["k"], NKV * HD, H, s(ty["k"]), NKV)
        put(p + "attn_v.weight", hp + "self_attn.v_proj.weight", ty["v"], NKV * HD, H, s(ty["v"]))
        o_type = ty["o"] if NH * HD % 256 == 0 else T.Q8_0
        put(p + "attn_output.weight", hp + "self_attn.o_proj.weight", o_type, H, NH * HD, s(o_type))
        if arch == "qwen2":
            for proj, rows in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
                b = (0.1 * RNG.standard_normal(rows)).astype(np.float32)
                w.add_tensor(p + f"attn_{proj}.bias", b)
                hf[hp + f"self_attn.{proj}_proj.bias"] = b
        if arch == "qwen3":
            for proj in ("q", "k"):
                x = (1.0 + 0.1 * RNG.standard_normal(HD)).astype(np.float32)
                w.add_tensor(p + f"attn_{proj}_norm.weight", x)
                hf[hp + f"self_attn.{proj}_norm.weight"] = x
        put_norm(p + "ffn_norm.weight", hp + "post_attention_layernorm.weight")
        put(p + "ffn_gate.weight", hp + "mlp.gate_proj.weight", ty["gate"], I, H, s(ty["gate"]))
        put(p + "ffn_up.weight", hp + "mlp.up_proj.weight", ty["up"], I, H, s(ty["up"]))
        put(p + "ffn_down.weight", hp + "mlp.down_proj.weight", ty["down"], H, I, s(ty["down"]))
    put_norm("output_norm.weight", "model.norm.weight")
    put("output.weight", "lm_head.weight", T.Q6_K, V, H, 1e-4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    d = os.path.join(out, name + "_hf")
    os.makedirs(d, exist_ok=True)
    config = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]],
        "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "vocab_size": V,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "bfloat16",
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if arch == "qwen2":
        del config["head_dim"]
    write_safetensors(os.path.join(d, "model.safetensors"), hf)


def write_safetensors(path, tensors):
    """safetensors with BF16 entries (numpy has no bf16: write the header by hand)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        v = tensors[name]
        if isinstance(v, tuple):
            dtype, arr = "BF16", v[1]
        else:
            arr = v
            dtype = {np.float32: "F32", np.float16: "F16"}[arr.dtype.type]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_dequant_q5(out):
    """dequant_q5.gguf / dequant_q5_reference.f32: Q5_0 and Q5_1 [4, 256] tensors (written after
    the rest, with their own random stream, so the other fixtures stay as they were)."""
    rng = np.random.default_rng(20261207)
    w = gguf.GGUFWriter(os.path.join(out, "dequant_q5.gguf"), "llama")
    refs = []
    for t in (T.Q5_0, T.Q5_1):
        raw = random_blocks(t, 4, 256, 1.0, rng)
        add(w, t.name.lower(), raw, t)
        refs.append(gguf.quants.dequantize(raw, t).reshape(-1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    np.concatenate(refs).astype("<f4").tofile(os.path.join(out, "dequant_q5_reference.f32"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gguf"
    os.makedirs(out, exist_ok=True)
    write_dequant(out)
    write_tiny_llama(out)
    write_tiny_llama(out, "qwen2")
    write_tiny_llama(out, "qwen3")
    write_dequant_q5(out)


if __name__ == "__main__":
    main()
