#include "model/finish_rules.h"

#include <algorithm>

namespace icecache::model {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kNone:
      break;
  }
  return "";
}

TokenStops::TokenStops(const std::vector<int32_t>& stop_ids, const std::vector<int32_t>& eos_ids, bool ignore_eos,
                       int max_tokens, int64_t max_position)
    : stops_(stop_ids), max_tokens_(max_tokens), max_position_(max_position) {
  if (!ignore_eos) stops_.insert(stops_.end(), eos_ids.begin(), eos_ids.end());
  std::sort(stops_.begin(), stops_.end());
  stops_.erase(std::unique(stops_.begin(), stops_.end()), stops_.end());
}

bool TokenStops::IsStop(int32_t token) const { return std::binary_search(stops_.begin(), stops_.end(), token); }

FinishReason TokenStops::After(int32_t token, int generated, int64_t length) const {
  if (IsStop(token)) return FinishReason::kStop;
  if (generated >= max_tokens_) return FinishReason::kLength;
  if (length > max_position_) return FinishReason::kContext;
  return FinishReason::kNone;
}

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (s.empty()) continue;
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

std::string StopStrings::Push(std::string_view piece) {
  if (stopped_) return "";
  text_.append(piece);
  size_t emit_to = text_.size();
  if (!stops_.empty()) {
    // A stop string that ends in the new text starts after the last max_len_ - 1 emitted bytes.
    const size_t from = emitted_ + 1 > max_len_ ? emitted_ + 1 - max_len_ : 0;
    size_t hit = std::string::npos;
    for (const std::string& s : stops_) hit = std::min(hit, text_.find(s, from));
    if (hit != std::string::npos) {
      stopped_ = true;
      emit_to = std::max(hit, emitted_);
    } else {
      size_t hold = 0;  // the longest tail that is a proper prefix of a stop string
      for (const std::string& s : stops_) {
        for (size_t k = std::min(s.size() - 1, text_.size() - emitted_); k > hold; --k) {
          if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
            hold = k;
            break;
          }
        }
      }
      emit_to = text_.size() - hold;
    }
  }
  std::string out = text_.substr(emitted_, emit_to - emitted_);
  emitted_ = emit_to;
  return out;
}

std::string StopStrings::Flush() {
  if (stopped_) return "";
  std::string out = text_.substr(emitted_);
  emitted_ = text_.size();
  return out;
}

}  // namespace icecache::model
