// Token sampling for one request: greedy, temperature, top-k, top-p, repetition penalty, seeded.
//
// Order of operations (as Hugging Face transformers' logits processors and vLLM): repetition
// penalty over the context tokens (prompt + generated; a positive logit is divided by the
// penalty, a negative one multiplied), then OpenAI's frequency and presence penalties over the
// generated tokens (logit[j] -= frequency * count_j + presence * (count_j > 0)), then
// temperature, top-k, top-p, softmax, draw. temperature == 0 is greedy (argmax, lowest id on
// ties); top_k == 1 is greedy too.
//
// Logprobs (params.logprobs >= 0): after each draw, log_softmax of the RAW logits (before the
// penalties and the temperature, as vLLM returns by default) at the drawn token and at the
// params.logprobs most likely tokens, computed on the device (kernels::ComputeTokenLogprobs).
//
// Reproducibility: the same params (seed included) and the same logits give the same tokens.
// The logits are in the memory of the sampler's device, where the penalty and the arg-max / top-k
// selection run; only the chosen token (greedy) or the sorted candidate set comes back to the
// host for the seeded draw. A Sampler is not thread-safe; one per sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"
#include "kernels/sampling.h"

namespace icecache::model {

struct SamplingParams {
  float temperature = 0.f;          // 0 = greedy; else > 0
  int top_k = 0;                    // 0 = all tokens
  float top_p = 1.f;                // in (0, 1]
  std::optional<uint64_t> seed;     // unset = nondeterministic
  float repetition_penalty = 1.f;   // 1 = off; else > 0
  int max_tokens = 16;              // generated tokens, >= 1
  std::vector<int32_t> stop_ids;    // generation stops after producing one of these
  std::vector<std::string> stop_strings;  // stops when the text contains one (needs a tokenizer)
  bool ignore_eos = false;          // when false, eos ids (config.json and tokenizer_config.json) stop too
  float frequency_penalty = 0.f;    // finite; OpenAI's API allows [-2, 2] (the router checks that)
  float presence_penalty = 0.f;     // finite; idem
  int logprobs = -1;                // -1 = off; else 0..kernels::kMaxTopLogprobs top entries per token
};

// The logprobs of one sampled token (see the header comment).
using TokenLogprobs = kernels::TokenLogprobs;

// INVALID_ARGUMENT naming the bad field.
Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  // `device`: where the logits passed to Sample live (the model's device).
  Sampler(const SamplingParams& params, kernels::Device device);

  // Picks the next token from logits [vocab] in the device's memory (not modified). `context` =
  // prompt + generated tokens so far (the repetition penalty uses all of it); its last
  // `num_generated` tokens are the generated ones (the frequency / presence penalties count
  // those). INVALID_ARGUMENT on empty logits or num_generated > context.size().
  StatusOr<int32_t> Sample(std::span<const float> logits, std::span<const int32_t> context,
                           size_t num_generated = 0);

  // The logprobs of the token the last Sample returned; REQUIRES params.logprobs >= 0 and a
  // successful Sample.
  const TokenLogprobs& last_logprobs() const { return last_logprobs_; }

  // Advances the random stream by `draws` draws, as if Sample had drawn that many times (each
  // non-greedy Sample draws exactly once; greedy draws nothing). A sequence continued elsewhere
  // (migration) skips the draws its earlier tokens used, so it sees the same random stream.
  void SkipDraws(uint64_t draws) { rng_.discard(draws); }

 private:
  StatusOr<int32_t> Draw(std::span<const float> logits, std::span<const int32_t> context, size_t num_generated);

  SamplingParams params_;
  kernels::Device device_;
  std::mt19937_64 rng_;
  // Penalised row, repetition-penalty ids, count-penalty ids and counts, arg-max result.
  kernels::DeviceBuffer work_, ids_, count_ids_, counts_, best_;
  std::vector<int32_t> seen_, seen_counts_;
  TokenLogprobs last_logprobs_;
};

}  // namespace icecache::model
