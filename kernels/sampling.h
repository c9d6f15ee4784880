// Token selection helpers for the engine's sampler: greedy argmax over rows of logits, and the
// candidate set of top-k / top-p (nucleus) sampling with its normalised probabilities.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"

namespace icecache::kernels {

struct ArgmaxParams {
  const float* logits = nullptr;  // [rows, vocab]
  int32_t* out = nullptr;         // [rows]: index of the largest logit (lowest index on ties)
  int rows = 0;
  int vocab = 0;
};
// Both pointers in the backend's memory. NaN logits are never chosen unless a row is all NaN
// (then index 0).
Status Argmax(const ArgmaxParams& p, Backend backend = Backend::kCpu);

// The distribution a sampler draws from, as Hugging Face transformers' logits processors build
// it in this order: logits / temperature, keep the top_k largest (top_k <= 0: all), then keep the
// smallest prefix (by descending probability) whose cumulative probability reaches top_p (at
// least one token; top_p >= 1: all), then softmax over the kept tokens.
// temperature <= 0 means greedy: one candidate, the argmax, with probability 1.
struct TopKTopPParams {
  const float* logits = nullptr;  // [vocab] one row, in the backend's memory
  int vocab = 0;
  float temperature = 1.f;
  int top_k = 0;
  float top_p = 1.f;              // in (0, 1]
};

// Host-side result: ids sorted by descending probability (ties: lower id first); probs sum to 1.
struct SamplingCandidates {
  std::vector<int32_t> ids;
  std::vector<float> probs;
};

StatusOr<SamplingCandidates> TopKTopPCandidates(const TopKTopPParams& p,
                                                Backend backend = Backend::kCpu);

// Repetition penalty (transformers' order: before temperature), in place on one row: for every
// id in ids, a positive logit is divided by `penalty`, any other multiplied by it.
struct RepetitionPenaltyParams {
  float* logits = nullptr;       // [vocab] one row, in the backend's memory
  const int32_t* ids = nullptr;  // [count] distinct ids in [0, vocab), in the backend's memory
  int count = 0;
  int vocab = 0;
  float penalty = 1.f;           // > 0
};
Status RepetitionPenalty(const RepetitionPenaltyParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
