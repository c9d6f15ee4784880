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

// Host-side result: ids sorted by descending probability (ties: lower id first), except with no
// top_k and top_p >= 1, where nothing is cut and every id comes in id order (no sort of the
// vocabulary); probs sum to 1.
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

// OpenAI's frequency and presence penalties, in place on one row: for every i,
//   logits[ids[i]] -= frequency * counts[i] + presence
// where counts[i] >= 1 is how often ids[i] occurs among the tokens generated so far (ids absent
// from the list occur 0 times and are left alone). Applied after the repetition penalty and
// before temperature, as vLLM does.
struct CountPenaltyParams {
  float* logits = nullptr;          // [vocab] one row, in the backend's memory
  const int32_t* ids = nullptr;     // [count] distinct ids in [0, vocab), in the backend's memory
  const int32_t* counts = nullptr;  // [count] occurrences (>= 1), in the backend's memory
  int count = 0;
  int vocab = 0;
  float frequency = 0.f;            // finite
  float presence = 0.f;             // finite
};
Status CountPenalty(const CountPenaltyParams& p, Backend backend = Backend::kCpu);

// log_softmax of one row, evaluated at the sampled token and at the `top` largest logits:
// logprob(j) = logits[j] - log(sum_i exp(logits[i])), summed in double on the CPU and in fp32
// with a max-shifted tree reduction on CUDA. NaN logits count as -inf. Only 2 + 2 * top values
// come back to the host (the log-sum-exp, the token's logit, the top (logit, id) pairs).
struct TokenLogprobsParams {
  const float* logits = nullptr;  // [vocab] one row, in the backend's memory
  int vocab = 0;
  int32_t token = 0;              // in [0, vocab)
  int top = 0;                    // in [0, min(vocab, kMaxTopLogprobs)]
};
inline constexpr int kMaxTopLogprobs = 20;

// Host-side result.
struct TokenLogprobs {
  float logprob = 0.f;                 // of `token`; <= 0
  std::vector<int32_t> top_ids;        // [top] by descending logprob (ties: lower id first)
  std::vector<float> top_logprobs;     // [top]
};
StatusOr<TokenLogprobs> ComputeTokenLogprobs(const TokenLogprobsParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
