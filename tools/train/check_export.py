#!/usr/bin/python3
"""Checks an exported passkey model directory with independent readers.

  /usr/bin/python3 -m pip install --break-system-packages --user tokenizers safetensors
  /usr/bin/python3 tools/train/check_export.py tools/models/passkey

1. The Hugging Face `tokenizers` library loads tokenizer.json and encodes eval prompts to exactly
   the ids the training/eval code uses (with <|begin_of_text|> written as text in front), and
   decodes them back to the same text.
2. The `safetensors` library (numpy backend) reads model.safetensors; names and shapes match what
   HF LlamaForCausalLM expects for config.json; values equal our own reader's.
3. If `transformers` is importable (pip install --user --no-deps transformers==4.47.1 works with
   Debian's torch 1.13): AutoTokenizer loads the directory and encodes like us, and HF
   LlamaForCausalLM (eager attention) gives the same logits as our torch model on an eval prompt.
"""

import json
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import passkey_lib as pl  # noqa


def main():
    d = sys.argv[1]
    from tokenizers import Tokenizer as HFTok
    from safetensors.numpy import load_file

    hf = HFTok.from_file(os.path.join(d, "tokenizer.json"))
    _, tok = pl.load_model_dir(d)
    n = 0
    for i in range(30):
        rng = random.Random(123_456_789 + i)
        T = [300, 1200, 5000][i % 3]
        s = [pl.make_passkey, pl.make_needle, pl.make_ar][i % 3](tok, rng, T)
        a0, _ = s.answers[0]
        text = pl.SPECIAL_TOKENS[0] + tok.decode(s.ids[1:a0])
        got = hf.encode(text, add_special_tokens=False).ids
        assert got == s.ids[:a0], ("prompt ids differ", i, got[:20], s.ids[:20])
        full = hf.encode(tok.decode(s.ids[1:]), add_special_tokens=False).ids
        assert full == s.ids[1:], ("full ids differ", i)
        assert hf.decode(s.ids[1:], skip_special_tokens=False) == tok.decode(s.ids[1:])
        n += len(s.ids)
    print("tokenizer.json: HF tokenizers %s reproduces %d ids of 30 prompts" % (
        __import__("tokenizers").__version__, n))

    cfg = json.load(open(os.path.join(d, "config.json")))
    w = load_file(os.path.join(d, "model.safetensors"))
    H, K, D, E = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                  cfg["hidden_size"])
    I, V = cfg["intermediate_size"], cfg["vocab_size"]
    want = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    if not cfg["tie_word_embeddings"]:
        want["lm_head.weight"] = (V, E)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        want.update({p + "input_layernorm.weight": (E,), p + "post_attention_layernorm.weight": (E,),
                     p + "self_attn.q_proj.weight": (H * D, E),
                     p + "self_attn.k_proj.weight": (K * D, E),
                     p + "self_attn.v_proj.weight": (K * D, E),
                     p + "self_attn.o_proj.weight": (E, H * D),
                     p + "mlp.gate_proj.weight": (I, E), p + "mlp.up_proj.weight": (I, E),
                     p + "mlp.down_proj.weight": (E, I)})
    assert set(w) == set(want), set(w) ^ set(want)
    ours = pl.load_safetensors(os.path.join(d, "model.safetensors"))
    for k, shape in want.items():
        assert tuple(w[k].shape) == shape, (k, w[k].shape, shape)
        assert np.array_equal(w[k], ours[k].numpy()), k
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    print("model.safetensors: %d tensors, %.2f MB, names/shapes match config.json, "
          "safetensors %s agrees with our reader" % (len(w), size / 1e6,
                                                     __import__("safetensors").__version__))

    try:
        import torch
        import transformers
        from transformers import AutoTokenizer, LlamaForCausalLM
    except ImportError:
        print("transformers not importable: skipped the HF forward check")
        return
    torch.set_num_threads(1)
    ht = AutoTokenizer.from_pretrained(d)
    rng = random.Random(987_654_321)
    s = pl.make_needle(tok, rng, 700, 0.3, n_needles=4)
    a0, a1 = s.answers[0]
    prompt = tok.decode(s.ids[1:a0])
    got = ht(prompt)["input_ids"]
    assert got == s.ids[:a0], ("AutoTokenizer ids differ (bos added?)", got[:5], s.ids[:5])
    hm = LlamaForCausalLM.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float32)
    hm.eval()
    ours, _ = pl.load_model_dir(d)
    ours.eval()
    ids = torch.tensor(s.ids[:a1])[None]
    with torch.no_grad():
        ref = hm(ids).logits[0]
        mine = ours(ids, torch.arange(ids.shape[1])[None])[0]
        mine_chunked = ours(ids, torch.arange(ids.shape[1])[None], q_chunk=128)[0]
    err = (ref - mine).abs().max().item()
    err_c = (ref - mine_chunked).abs().max().item()
    scale = ref.abs().max().item()
    # f32 on both sides, same op order up to matmul blocking: 1e-4 relative to the logit scale
    assert err <= 1e-4 * max(1.0, scale) and err_c <= 1e-4 * max(1.0, scale), (err, err_c, scale)
    same_argmax = bool(torch.equal(ref.argmax(-1), mine.argmax(-1)))
    print("transformers %s: AutoTokenizer ids match; LlamaForCausalLM logits max|diff| %.2e "
          "(chunked %.2e, logit scale %.1f), argmax equal: %s" % (
              transformers.__version__, err, err_c, scale, same_argmax))


if __name__ == "__main__":
    main()
