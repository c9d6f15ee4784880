"""Shared pieces of the passkey model: tokenizer, data generators, Llama model, safetensors I/O.

Used by train_passkey.py and eval_passkey.py (run both with /usr/bin/python3, which sees torch 1.13).
Everything here is plain Python/numpy/torch; no transformers / tokenizers / safetensors packages needed.
"""

import json
import math
import random
import struct

import numpy as np
import regex
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE in the Llama-3 style (Split regex + ByteLevel, no prefix space).
# Merges only ever join letters (optionally led by the space marker), so digits, punctuation and
# whitespace stay single bytes and pieces can be encoded separately and concatenated.

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_RE = regex.compile(LLAMA3_SPLIT)

VOCAB_SIZE = 1024
NUM_SPECIAL = 4
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|reserved_0|>"]
BOS_ID = VOCAB_SIZE - NUM_SPECIAL          # 1020
EOS_ID = BOS_ID + 1                        # 1021
PAD_ID = BOS_ID + 2                        # 1022
NUM_REGULAR = VOCAB_SIZE - NUM_SPECIAL     # 256 bytes + up to 764 merges


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_UNI = bytes_to_unicode()
UNI_TO_BYTE = {v: k for k, v in BYTE_TO_UNI.items()}
_MERGEABLE = regex.compile(r"^\u0120?[A-Za-z]+$")  # \u0120 is the byte-level space marker


def train_bpe(corpus, num_merges):
    """Greedy BPE on word counts; only letter(+leading space) tokens are merged."""
    counts = {}
    for piece in _SPLIT_RE.findall(corpus):
        w = "".join(BYTE_TO_UNI[b] for b in piece.encode("utf-8"))
        counts[w] = counts.get(w, 0) + 1
    words = {w: list(w) for w in counts}
    merges = []
    for _ in range(num_merges):
        pairs = {}
        for w, syms in words.items():
            c = counts[w]
            for a, b in zip(syms, syms[1:]):
                if _MERGEABLE.match(a + b):
                    pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        for w, syms in words.items():
            i, out = 0, []
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == best[0] and syms[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        self.vocab = {BYTE_TO_UNI[b]: b for b in range(256)}
        for a, b in self.merges:
            self.vocab[a + b] = len(self.vocab)
        assert len(self.vocab) <= NUM_REGULAR, len(self.vocab)
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.id_to_tok = {v: k for k, v in self.vocab.items()}
        self.cache = {}

    def _bpe(self, word):
        syms = list(word)
        while len(syms) > 1:
            best, best_rank = None, None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            syms = syms[:best] + [syms[best] + syms[best + 1]] + syms[best + 2:]
        return [self.vocab[s] for s in syms]

    def encode(self, text):
        """Plain text (no special tokens) -> ids."""
        out = []
        for piece in _SPLIT_RE.findall(text):
            ids = self.cache.get(piece)
            if ids is None:
                w = "".join(BYTE_TO_UNI[b] for b in piece.encode("utf-8"))
                ids = self._bpe(w)
                self.cache[piece] = ids
            out.extend(ids)
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            if i >= NUM_REGULAR:
                bs += SPECIAL_TOKENS[i - NUM_REGULAR].encode() if i - NUM_REGULAR < NUM_SPECIAL else b"?"
            elif i in self.id_to_tok:
                bs += bytes(UNI_TO_BYTE[c] for c in self.id_to_tok[i])
        return bs.decode("utf-8", errors="replace")

    def to_json(self):
        vocab = dict(self.vocab)
        # Unused regular ids keep the vocabulary dense up to NUM_REGULAR.
        k = 0
        while len(vocab) < NUM_REGULAR:
            vocab["<|unused_%d|>" % k] = len(vocab)
            k += 1
        added = [{"id": NUM_REGULAR + i, "content": t, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True}
                 for i, t in enumerate(SPECIAL_TOKENS)]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False}]},
            "post_processor": {"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                 "use_regex": True},
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": SPECIAL_TOKENS[0], "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"SpecialToken": {"id": SPECIAL_TOKENS[0], "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": SPECIAL_TOKENS[0], "type_id": 1}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {SPECIAL_TOKENS[0]: {"id": SPECIAL_TOKENS[0],
                                                        "ids": [NUM_REGULAR],
                                                        "tokens": [SPECIAL_TOKENS[0]]}}}]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [a + " " + b for a, b in self.merges]},
        }


# ----------------------------------------------------------------------------------------------
# Text generators. Filler never contains digits; numbers only appear in needles/pairs.

PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. "
                 "Find it and memorize it. I will quiz you about the important information there.\n")
PASSKEY_FILLER = ("The grass is green. The sky is blue. The sun is yellow. "
                  "Here we go. There and back again.")
PASSKEY_NEEDLE = " The pass key is {k}. Remember it. {k} is the pass key."
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"
NEEDLE_INTRO = ("Some magic numbers are hidden inside the following text. "
                "Remember them all, I will ask about one of them.\n")
NEEDLE_TEXT = " The magic number for {name} is {n}."
NEEDLE_QUESTION = "\nWhat is the magic number for {name}? The magic number for {name} is"
AR_INTRO = "Remember these pairs.\n"

NAMES = """Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Mona Nathan Olivia
Peter Quinn Rachel Steven Tina Umar Vera Walter Xena Yusuf Zoe Aaron Bella Caleb Diana Ethan Fiona
George Hannah Isaac Julia Kevin Laura Marcus Nina Oscar Paula Ruben Sara Thomas Ursula Victor Wendy
Adrian Beatrice Cyrus Delia Edgar Flora Gustav Helga Igor Jasmine Kurt Lena Milo Nora Otto Priya
Rosa Simon Tara Vince Willa Yara Zane Arthur Clara Dmitri Elsa Felix Gloria Hugo Ingrid Jonas""".split()

NOUNS = """cat dog bird fish tree river mountain house garden window door table chair book letter
road city village forest lake ocean cloud storm wind rain snow field farmer teacher doctor child
friend king queen horse boat train bridge tower castle market kitchen lamp candle song story dream
stone flower apple bread cheese coffee paper pencil clock mirror island valley desert meadow""".split()
ADJS = """green blue yellow quiet old young bright dark small large happy tired gentle brave calm
cold warm soft heavy light slow quick strange simple ancient modern red white silver golden""".split()
VERBS = """sees finds likes builds paints carries follows watches visits remembers opens closes
crosses reaches leaves keeps moves touches hears loves""".split()
ADVS = """slowly quietly often never always today again together gladly softly""".split()
AR_KEYS = sorted(set(NOUNS + ADJS + """wolf hat cup rope shoe ring coin drum kite leaf nest owl
pear plum rose sand ship star sock tent vase wave yarn bell cake""".split()))


def grammar_sentence(rng):
    r = rng.random()
    if r < 0.4:
        s = "The %s %s %s the %s %s." % (rng.choice(ADJS), rng.choice(NOUNS), rng.choice(VERBS),
                                          rng.choice(ADJS), rng.choice(NOUNS))
    elif r < 0.7:
        s = "A %s %s %s." % (rng.choice(NOUNS), rng.choice(VERBS), rng.choice(ADVS))
    else:
        s = "The %s is %s and the %s is %s." % (rng.choice(NOUNS), rng.choice(ADJS),
                                               rng.choice(NOUNS), rng.choice(ADJS))
    return " " + s


def filler_sentences(tok, rng, kind):
    """Infinite iterator of encoded filler sentences (each led by a space)."""
    if kind == "repeat":
        sents = [" " + s.strip() + "." for s in PASSKEY_FILLER.split(".") if s.strip()]
        i = 0
        while True:
            yield tok.encode(sents[i % len(sents)])
            i += 1
    while True:
        yield tok.encode(grammar_sentence(rng))


def rand_number(rng, lo_digits, hi_digits):
    n = rng.randint(lo_digits, hi_digits)
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n - 1))


class Sample:
    """ids: prompt+answers; weights: per-target loss weight (for predicting ids[t] from <t);
    jump_lo/jump_hi: token range in which a position jump may be placed (filler);
    answers: list of (start, end) token spans that are supervised answers (eval uses the last)."""

    def __init__(self, ids, weights, answers, jump_lo, jump_hi, meta):
        self.ids, self.weights, self.answers = ids, weights, answers
        self.jump_lo, self.jump_hi, self.meta = jump_lo, jump_hi, meta
        self.copy_spans = []


class Builder:
    """Accumulates pieces with per-token loss weights."""

    def __init__(self):
        self.ids, self.w, self.answers = [BOS_ID], [0.0], []

    def add(self, ids, w):
        self.ids.extend(ids)
        self.w.extend([w] * len(ids))

    def add_answer(self, ids):
        s = len(self.ids)
        self.add(ids, 1.0)
        self.answers.append((s, len(self.ids)))


def _insert_points(sent_lens, total_filler, depths):
    """Sentence boundary indices nearest to each depth fraction of the filler tokens."""
    cum = np.cumsum([0] + sent_lens)
    return [int(np.argmin(np.abs(cum - d * total_filler))) for d in depths]


def make_passkey(tok, rng, ctx_len, depth=None, filler="repeat", lm_w=0.1):
    key = rand_number(rng, 5, 5)
    intro = tok.encode(PASSKEY_INTRO)
    needle = tok.encode(PASSKEY_NEEDLE.format(k=key))
    question = tok.encode(PASSKEY_QUESTION)
    answer = tok.encode(" " + key)
    budget = max(0, ctx_len - 1 - len(intro) - len(needle) - len(question) - len(answer))
    sents, n = [], 0
    it = filler_sentences(tok, rng, filler)
    while n < budget:
        s = next(it)
        sents.append(s)
        n += len(s)
    if depth is None:
        depth = rng.random()
    at = _insert_points([len(s) for s in sents], n, [depth])[0]
    b = Builder()
    b.add(intro, lm_w)
    for s in sents[:at]:
        b.add(s, lm_w)
    first = len(b.ids)
    b.add(needle, lm_w)
    # the first copy of the key is unpredictable: no loss on it
    pre = tok.encode(" The pass key is ")
    for i in range(first + len(pre), first + len(pre) + len(key)):
        b.w[i] = 0.0
    needle_span = (first, len(b.ids))
    jump_lo = len(b.ids)
    for s in sents[at:]:
        b.add(s, lm_w)
    jump_hi = len(b.ids)
    b.add(question, lm_w)
    b.add_answer(answer)
    return Sample(b.ids, b.w, b.answers, jump_lo, jump_hi,
                  {"task": "passkey", "key": key, "depth": depth, "needle_span": needle_span})


def make_needle(tok, rng, ctx_len, depth=None, n_needles=None, n_questions=1, filler="grammar",
                lm_w=0.1):
    if n_needles is None:
        n_needles = rng.randint(2, 8)
    names = rng.sample(NAMES, n_needles)
    nums = [rand_number(rng, 4, 7) for _ in names]
    intro = tok.encode(NEEDLE_INTRO)
    needles = [tok.encode(NEEDLE_TEXT.format(name=a, n=v)) for a, v in zip(names, nums)]
    asked = rng.sample(range(n_needles), min(n_questions, n_needles))
    qa = [(tok.encode(NEEDLE_QUESTION.format(name=names[i])), tok.encode(" " + nums[i] + "."))
          for i in asked]
    used = len(intro) + sum(map(len, needles)) + sum(len(q) + len(a) for q, a in qa)
    budget = max(0, ctx_len - 1 - used)
    sents, n = [], 0
    it = filler_sentences(tok, rng, filler)
    while n < budget:
        s = next(it)
        sents.append(s)
        n += len(s)
    # target needle (asked[0]) at `depth`, the others at random depths
    depths = [rng.random() for _ in range(n_needles)]
    if depth is not None:
        depths[asked[0]] = depth
    points = _insert_points([len(s) for s in sents], n, depths)
    order = sorted(range(n_needles), key=lambda i: (points[i], i))
    b = Builder()
    b.add(intro, lm_w)
    si = 0
    spans = {}
    for i in order:
        while si < points[i]:
            b.add(sents[si], lm_w)
            si += 1
        st = len(b.ids)
        b.add(needles[i], lm_w)
        ntok = len(tok.encode(" " + nums[i]))
        for j in range(len(b.ids) - 1 - ntok, len(b.ids) - 1):
            b.w[j] = 0.0
        spans[i] = (st, len(b.ids))
    jump_lo = len(b.ids)
    while si < len(sents):
        b.add(sents[si], lm_w)
        si += 1
    jump_hi = len(b.ids)
    for q, a in qa:
        b.add(q, lm_w)
        b.add_answer(a[:-1])   # digits (led by a space) are the answer; the "." is LM-weighted
        b.add(a[-1:], lm_w)
    # eval reads the first question only
    return Sample(b.ids, b.w, b.answers, jump_lo, jump_hi,
                  {"task": "needle", "name": names[asked[0]], "number": nums[asked[0]],
                   "depth": depths[asked[0]], "needle_span": spans[asked[0]],
                   "n_needles": n_needles})


def make_ar(tok, rng, ctx_len, n_questions=8, lm_w=0.1):
    """Associative recall: 'k1=v1, k2=v2, ...' then 'Questions: kq=' -> vq."""
    keys = list(AR_KEYS)
    rng.shuffle(keys)
    intro = tok.encode(AR_INTRO)
    b = Builder()
    b.add(intro, lm_w)
    pairs = []
    for k in keys:
        v = rand_number(rng, 2, 4)
        p = tok.encode((" " if pairs else "") + k + "=" + v + ",")
        if len(b.ids) + len(p) + 7 * n_questions + 4 > ctx_len:
            break
        st = len(b.ids)
        b.add(p, lm_w)
        nv = len(v)
        for j in range(len(b.ids) - 1 - nv, len(b.ids) - 1):
            b.w[j] = 0.0
        pairs.append((k, v, st))
    jump_lo = jump_hi = len(b.ids)
    b.add(tok.encode("\nQuestions:"), lm_w)
    qs = rng.sample(range(len(pairs)), min(n_questions, len(pairs)))
    for qi in qs:
        k, v, _ = pairs[qi]
        b.add(tok.encode(" " + k + "="), lm_w)
        b.add_answer(tok.encode(v))
        b.add(tok.encode(","), lm_w)
    return Sample(b.ids, b.w, b.answers, jump_lo, jump_hi,
                  {"task": "ar", "n_pairs": len(pairs)})


def make_copy(tok, rng, ctx_len, lm_w=0.1):
    """Induction bootstrap: a random run of words and numbers, then "Again:" and the same run.
    The repeat is returned as `copy` spans (trained with its own loss term), not as answers."""
    words = NOUNS + ADJS + NAMES
    b = Builder()
    b.add(tok.encode("Copy this."), lm_w)
    seg = []
    n = rng.randint(16, max(17, (ctx_len - 8) // 2 - 8))
    while len(seg) < n:
        if rng.random() < 0.4:
            seg.extend(tok.encode(" " + rand_number(rng, 1, 6)))
        else:
            seg.extend(tok.encode(" " + rng.choice(words)))
    b.add(seg, 0.0)
    jump_lo = jump_hi = len(b.ids)
    b.add(tok.encode("\nAgain:"), lm_w)
    st = len(b.ids)
    b.add(seg, 0.0)
    s = Sample(b.ids, b.w, [], jump_lo, jump_hi, {"task": "copy"})
    s.copy_spans = [(st, len(b.ids))]
    return s


# ----------------------------------------------------------------------------------------------
# Model: Hugging Face Llama semantics, written out by hand (torch 1.13 has no SDPA).

class Config:
    def __init__(self, **kw):
        self.vocab_size = VOCAB_SIZE
        self.hidden_size = 256
        self.intermediate_size = 768
        self.num_hidden_layers = 4
        self.num_attention_heads = 4
        self.num_key_value_heads = 2
        self.head_dim = 64
        self.rope_theta = 500000.0
        self.rms_norm_eps = 1e-5
        self.max_position_embeddings = 32768
        self.tie_word_embeddings = False
        self.__dict__.update(kw)

    def to_hf(self):
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta, "rope_scaling": None,
            "rms_norm_eps": self.rms_norm_eps, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
            "tie_word_embeddings": self.tie_word_embeddings, "torch_dtype": "float32",
            "use_cache": True, "transformers_version": "4.46.0",
        }


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(pos, head_dim, theta):
    """pos: [B, T] int64 -> cos, sin [B, 1, T, head_dim] (HF: emb = cat(freqs, freqs))."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = pos.double()[..., None] * inv.double()[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float()[:, None], emb.sin().float()[:, None]


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, H * D, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, K * D, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, K * D, bias=False)
        self.o_proj = nn.Linear(H * D, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, q_chunk=None, probe=None):
        B, T, _ = x.shape
        H, K, D = self.c.num_attention_heads, self.c.num_key_value_heads, self.c.head_dim
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, K, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, K, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = H // K
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(D)
        if q_chunk is None:
            s = torch.matmul(q, k.transpose(-1, -2)) * scale + mask
            p = torch.softmax(s.float(), dim=-1)
            o = torch.matmul(p, v)
            if probe is not None:
                probe["out"].append(p[:, :, probe["row"]].detach())
        else:  # eval at long context: query blocks to bound memory
            outs = []
            for s0 in range(0, T, q_chunk):
                s1 = min(T, s0 + q_chunk)
                s = torch.matmul(q[:, :, s0:s1], k[:, :, :s1].transpose(-1, -2)) * scale
                idx_q = torch.arange(s0, s1)[:, None]
                idx_k = torch.arange(0, s1)[None, :]
                s = s.masked_fill(idx_k > idx_q, float("-inf"))
                p = torch.softmax(s.float(), dim=-1)
                outs.append(torch.matmul(p, v[:, :, :s1]))
                if probe is not None and s0 <= probe["row"] < s1:
                    probe["out"].append(p[:, :, probe["row"] - s0].detach())
            o = torch.cat(outs, dim=2)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask, q_chunk=None, probe=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, q_chunk, probe)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        # scaled init of residual outputs
        for l in self.model.layers:
            nn.init.normal_(l.self_attn.o_proj.weight, std=0.02 / math.sqrt(2 * c.num_hidden_layers))
            nn.init.normal_(l.mlp.down_proj.weight, std=0.02 / math.sqrt(2 * c.num_hidden_layers))

    def forward(self, ids, pos, q_chunk=None, probe=None, logits_from=0):
        B, T = ids.shape
        x = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(pos, self.c.head_dim, self.c.rope_theta)
        mask = None
        if q_chunk is None:
            mask = torch.full((T, T), float("-inf")).triu(1)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, q_chunk, probe)
        x = self.model.norm(x[:, logits_from:])
        return self.lm_head(x)


# ----------------------------------------------------------------------------------------------
# safetensors, written/read by hand (the package is not available to /usr/bin/python3).

def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name].detach().cpu().float().contiguous().numpy().astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        s, e = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[s:e], dtype="<f4").copy()).view(
            *info["shape"])
    return out


def load_model_dir(d):
    with open(d + "/config.json") as f:
        hf = json.load(f)
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
            "max_position_embeddings", "tie_word_embeddings"]
    c = Config(**{k: hf[k] for k in keys})
    m = LlamaForCausalLM(c)
    sd = load_safetensors(d + "/model.safetensors")
    m.load_state_dict(sd, strict=True)
    with open(d + "/tokenizer.json") as f:
        tj = json.load(f)
    tok = Tokenizer([tuple(x.split(" ")) for x in tj["model"]["merges"]])
    return m, tok
