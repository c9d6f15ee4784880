// Checks of a public GenerateRequest that need neither the tokenizer nor a worker: sizes (prompt
// bytes, stop strings, stop token ids), UTF-8 of every text field, and sampling parameters. The
// router runs them first, so that nothing is tokenized, reserved or prefilled for a request that
// would be refused anyway. Every error is INVALID_ARGUMENT naming the field and the limit.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "icecache/v1/generation.pb.h"
#include "serving/cluster_config.h"

namespace icecache::router {

// Offset of the first byte that does not begin or continue a valid UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF are invalid), or -1 when `text` is valid.
int64_t FirstInvalidUtf8(std::string_view text);

// Most top logprobs per token (OpenAI's limit), and most choices (GenerateRequest.n) per request.
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr int kMaxChoices = 16;

// temperature finite and >= 0; top_p in [0, 1]; top_k >= 0; presence_penalty and
// frequency_penalty in [-2, 2]; top_logprobs in [0, kMaxTopLogprobs], > 0 only with logprobs.
// NaN and infinities are refused.
Status ValidateSampling(const v1::SamplingParams& sampling);

// Prompt text: non-empty, <= limits.max_prompt_bytes, valid UTF-8. Messages: at least one, role
// system, user or assistant, content valid UTF-8, contents together <= limits.max_prompt_bytes,
// only with a tokenizer. Stop strings: at most
// limits.max_stop_strings, each non-empty, <= limits.max_stop_string_bytes, valid UTF-8, and only
// with a tokenizer. Stop token ids: at most limits.max_stop_token_ids. n in [0, kMaxChoices].
// Sampling as above.
Status CheckRequestBeforeTokenizing(const v1::GenerateRequest& req, const cluster::LimitsSection& limits,
                                    bool has_tokenizer);

}  // namespace icecache::router
