#include "router/request_checks.h"

#include <cmath>
#include <string>

namespace icecache::router {
namespace {

namespace pb = ::icecache::v1;

Status CheckUtf8(std::string_view text, const std::string& field) {
  const int64_t bad = FirstInvalidUtf8(text);
  if (bad < 0) return Status::Ok();
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned>(static_cast<uint8_t>(text[bad])));
  return InvalidArgumentError(field + " is not valid UTF-8: byte " + std::to_string(bad) + " (" + hex +
                              ") does not begin or continue a character");
}

}  // namespace

int64_t FirstInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    if (s[i + 1] < lo || s[i + 1] > hi) return static_cast<int64_t>(i + 1);
    for (size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return static_cast<int64_t>(i + k);
    }
    i += len;
  }
  return -1;
}

// NaN fails every comparison, so each range is written as the condition that must hold.
Status ValidateSampling(const pb::SamplingParams& sp) {
  if (!(sp.temperature() >= 0.f && std::isfinite(sp.temperature()))) {
    return InvalidArgumentError("sampling.temperature = " + std::to_string(sp.temperature()) +
                                ": it must be a finite number >= 0 (0 = greedy)");
  }
  if (!(sp.top_p() >= 0.f && sp.top_p() <= 1.f)) {
    return InvalidArgumentError("sampling.top_p = " + std::to_string(sp.top_p()) +
                                ": it must be in [0, 1] (0 or 1 = off)");
  }
  if (sp.top_k() < 0) {
    return InvalidArgumentError("sampling.top_k = " + std::to_string(sp.top_k()) + ": it must be >= 0 (0 = off)");
  }
  if (!(sp.presence_penalty() >= -2.f && sp.presence_penalty() <= 2.f)) {
    return InvalidArgumentError("sampling.presence_penalty = " + std::to_string(sp.presence_penalty()) +
                                ": it must be in [-2, 2] (0 = off)");
  }
  if (!(sp.frequency_penalty() >= -2.f && sp.frequency_penalty() <= 2.f)) {
    return InvalidArgumentError("sampling.frequency_penalty = " + std::to_string(sp.frequency_penalty()) +
                                ": it must be in [-2, 2] (0 = off)");
  }
  if (sp.top_logprobs() < 0 || sp.top_logprobs() > kMaxTopLogprobs) {
    return InvalidArgumentError("sampling.top_logprobs = " + std::to_string(sp.top_logprobs()) + ": it must be in [0, " +
                                std::to_string(kMaxTopLogprobs) + "]");
  }
  if (sp.top_logprobs() > 0 && !sp.logprobs()) {
    return InvalidArgumentError("sampling.top_logprobs needs sampling.logprobs = true");
  }
  return Status::Ok();
}

Status CheckRequestBeforeTokenizing(const pb::GenerateRequest& req, const cluster::LimitsSection& limits,
                                    bool has_tokenizer) {
  if (req.prompt_case() == pb::GenerateRequest::kText) {
    if (req.text().empty()) return InvalidArgumentError("prompt text is empty");
    if (static_cast<int64_t>(req.text().size()) > limits.max_prompt_bytes) {
      return InvalidArgumentError("prompt text has " + std::to_string(req.text().size()) +
                                  " bytes, more than limits.max_prompt_bytes = " +
                                  std::to_string(limits.max_prompt_bytes));
    }
    ICE_RETURN_IF_ERROR(CheckUtf8(req.text(), "prompt text"));
  }
  if (req.prompt_case() == pb::GenerateRequest::kMessages) {
    const auto& messages = req.messages().messages();
    if (messages.empty()) return InvalidArgumentError("messages is empty: send at least one message");
    if (!has_tokenizer) return InvalidArgumentError("messages need a model with a tokenizer");
    int64_t bytes = 0;
    for (int i = 0; i < messages.size(); ++i) {
      const std::string field = "messages[" + std::to_string(i) + "]";
      const std::string& role = messages[i].role();
      if (role != "system" && role != "user" && role != "assistant") {
        return InvalidArgumentError(field + ".role = '" + (FirstInvalidUtf8(role) < 0 ? role : "?") +
                                    "': it must be system, user or assistant");
      }
      ICE_RETURN_IF_ERROR(CheckUtf8(messages[i].content(), field + ".content"));
      bytes += static_cast<int64_t>(messages[i].content().size());
    }
    if (bytes > limits.max_prompt_bytes) {
      return InvalidArgumentError("messages have " + std::to_string(bytes) +
                                  " bytes of content, more than limits.max_prompt_bytes = " +
                                  std::to_string(limits.max_prompt_bytes));
    }
  }
  if (req.cache_salt().size() > 256) {
    return InvalidArgumentError("cache_salt has " + std::to_string(req.cache_salt().size()) +
                                " bytes, more than 256");
  }
  if (req.stop_size() > 0 && !has_tokenizer) return InvalidArgumentError("stop strings need a model with a tokenizer");
  if (req.stop_size() > limits.max_stop_strings) {
    return InvalidArgumentError(std::to_string(req.stop_size()) + " stop strings, more than limits.max_stop_strings = " +
                                std::to_string(limits.max_stop_strings));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string& stop = req.stop(i);
    const std::string field = "stop[" + std::to_string(i) + "]";
    if (stop.empty()) return InvalidArgumentError(field + " is empty");
    if (static_cast<int64_t>(stop.size()) > limits.max_stop_string_bytes) {
      return InvalidArgumentError(field + " has " + std::to_string(stop.size()) +
                                  " bytes, more than limits.max_stop_string_bytes = " +
                                  std::to_string(limits.max_stop_string_bytes));
    }
    ICE_RETURN_IF_ERROR(CheckUtf8(stop, field));
  }
  if (req.stop_token_ids_size() > limits.max_stop_token_ids) {
    return InvalidArgumentError(std::to_string(req.stop_token_ids_size()) +
                                " stop_token_ids, more than limits.max_stop_token_ids = " +
                                std::to_string(limits.max_stop_token_ids));
  }
  if (req.n() < 0 || req.n() > kMaxChoices) {
    return InvalidArgumentError("n = " + std::to_string(req.n()) + ": it must be in [1, " + std::to_string(kMaxChoices) +
                                "] (0 = 1)");
  }
  return ValidateSampling(req.sampling());
}

}  // namespace icecache::router
