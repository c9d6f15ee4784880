// When a request ends: the one set of finish rules used by the single-process generator
// (model/generator.h), the decode engine (decode_worker/decode_engine.h) and the router's request
// path (router/request_path.h). Token rules (stop ids, EOS, max_tokens, the context limit) run
// where tokens are sampled; stop strings run where text is decoded, holding back a tail that could
// still grow into a stop string so that no client ever sees part of one.
//
// Thread safety: TokenStops is immutable; a StopStrings belongs to one request (not thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace icecache::model {

enum class FinishReason : int {
  kNone = 0,    // still running
  kStop = 1,    // produced a stop id (eos included unless ignore_eos) or a stop string
  kLength = 2,  // max_tokens generated
  kContext = 3, // reached max_position_embeddings
};
std::string_view FinishReasonName(FinishReason r);  // "", "stop", "length", "context"

// The token-level rules of one request.
class TokenStops {
 public:
  // stop_ids: the request's; eos_ids: the model's (config and tokenizer), ignored with ignore_eos.
  // max_tokens >= 1: tokens to generate at most (the prefill's first token counts);
  // max_position: the model's context limit (positions 0 .. max_position - 1).
  TokenStops(const std::vector<int32_t>& stop_ids, const std::vector<int32_t>& eos_ids, bool ignore_eos,
             int max_tokens, int64_t max_position);

  // True when `token` ends the request by itself (a stop id or, unless ignored, an EOS id).
  bool IsStop(int32_t token) const;

  // The rule after the `generated`-th token (`token`) when the sequence holds `length` tokens
  // (prompt + generated, `token` included): kStop for a stop token, else kLength once
  // generated >= max_tokens, else kContext when `token` has no valid position left
  // (length > max_position), else kNone. Earlier rules win.
  FinishReason After(int32_t token, int generated, int64_t length) const;

 private:
  std::vector<int32_t> stops_;
  int max_tokens_;
  int64_t max_position_;
};

// Stop strings over a stream of decoded text pieces.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);  // empty strings are ignored

  bool empty() const { return stops_.empty(); }
  bool stopped() const { return stopped_; }

  // Appends `piece` and returns the text that is final now: everything before the first stop
  // string once one appears (stopped() turns true; later calls return ""), otherwise everything
  // except the longest tail that is a proper prefix of some stop string.
  std::string Push(std::string_view piece);

  // The held-back tail, for a request that ends for another reason ("" after a stop string).
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string text_;   // all text so far
  size_t emitted_ = 0; // bytes of text_ returned
  bool stopped_ = false;
};

}  // namespace icecache::model
