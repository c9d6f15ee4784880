// Random checkpoints in Hugging Face layout, for tests and benchmarks (`icecache make-model`).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "kernels/dtype.h"
#include "model/config.h"

namespace icecache::model {

struct RandomModelSpec {
  Architecture arch = Architecture::kLlama;
  int hidden = 64;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 0;       // 0 = hidden / heads
  int intermediate = 0;   // 0 = 8/3 * hidden rounded up to a multiple of 32
  int vocab = 512;        // total ids, the two special tokens (bos, eos = the last two ids) included
  int max_position = 4096;
  double rope_theta = 10000.0;
  kernels::DType dtype = kernels::DType::kBF16;
  bool tie = false;
  uint64_t seed = 0;
  bool write_tokenizer = true;  // tokenizer.json + tokenizer_config.json (needs vocab >= 258)
  // With the tokenizer: <|im_start|> and <|im_end|> as special tokens and a ChatML chat_template
  // in tokenizer_config.json (SmolLM2's), so that the checkpoint serves chat requests.
  bool chat_template = false;
};

// The model of the failure tests and the soak bench (tests/cluster/migration_test.cc,
// bench/soak_bench.cc): f32, hidden 256, 6 layers, 4 heads over 2 kv heads, 320 ids, seed 11. Big
// enough that a 4-stream batch takes a few ms per step on one core (a stream is still running when
// a worker is killed), small enough to load in a blink; one spec, so both run the same model.
inline RandomModelSpec FailureTestModelSpec() {
  RandomModelSpec spec;
  spec.hidden = 256;
  spec.layers = 6;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.vocab = 320;
  spec.max_position = 4096;
  spec.dtype = kernels::DType::kF32;
  spec.seed = 11;
  return spec;
}

// Builds the ModelConfig a spec describes (INVALID_ARGUMENT for inconsistent sizes).
StatusOr<ModelConfig> RandomModelConfig(const RandomModelSpec& spec);

// Writes DIR/config.json, DIR/model.safetensors and (optionally) a byte-level BPE tokenizer.
// Weights ~ N(0, 0.02²) (embeddings and lm_head N(0, 1/hidden) so logits have spread ~1),
// norm weights 1, biases N(0, 0.02²). Deterministic for a given seed. Creates DIR if needed.
Status WriteRandomCheckpoint(const std::string& dir, const RandomModelSpec& spec);

// WriteRandomCheckpoint unless DIR/config.json exists already (a checkpoint cached across test
// processes; it is not compared with `spec`). Safe when several processes race for the same DIR:
// each writes beside it (DIR.tmp.PID) and renames into place; a loser drops its copy.
Status EnsureRandomCheckpoint(const std::string& dir, const RandomModelSpec& spec);

}  // namespace icecache::model
