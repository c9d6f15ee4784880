#!/usr/bin/env python3
"""A GGUF holding a llama-style SentencePiece tokenizer (tokenizer.ggml.model "llama": pieces,
scores, token types, byte fallback), trained with Google's `sentencepiece` on a small corpus, and
the ids `sentencepiece` itself gives for the texts of make_smollm2_reference.py.

  /usr/bin/python3 -m pip install --break-system-packages sentencepiece gguf "tokenizers<0.22"
  /usr/bin/python3 tools/gguf/make_spm_fixture.py tests/fixtures/gguf

Writes spm_tokenizer.gguf and spm_reference.json ({"texts", "ids", "decoded"}).
"""
import io
import json
import os
import random
import sys

import gguf
import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_smollm2_reference import texts  # noqa: E402


def corpus():
    rng = random.Random(3)
    words = ("the of and to in is that for it as was with be by on not he this are or his from at which but "
             "have an they you were her she there been one all we their has would when if so what no more out "
             "memory cache attention token model inference budget page tree query key value Paris Tokyo "
             "naïve café 日本 über 12 345 6789").split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) for _ in range(3000)]


def main():
    out = sys.argv[1]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, vocab_size=520, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, num_threads=1)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
    w = gguf.GGUFWriter(os.path.join(out, "spm_tokenizer.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ts = texts()
    ids = [sp.encode(t) for t in ts]
    with open(os.path.join(out, "spm_reference.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "sentencepiece " + spm.__version__, "texts": ts, "ids": ids,
                   "decoded": [sp.decode(i) for i in ids]}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
