#include "model/tokenizer/tokenizer_impl.h"

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {

StatusOr<std::string> Tokenizer::DecodeBytes(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return Decode(ids, skip_special_tokens);
}

void TokenizerImpl::EncodeText(std::string_view text, bool at_text_start, std::vector<int32_t>* ids) const {
  std::string normalized = normalizer_ ? normalizer_->Normalize(text) : std::string(text);
  std::vector<Segment> segments;
  if (normalized_matcher_.empty()) {
    if (!normalized.empty()) segments.push_back({normalized, -1});
  } else {
    segments = normalized_matcher_.Split(normalized);
  }
  std::vector<Piece> pieces;
  for (const Segment& seg : segments) {
    if (seg.token >= 0) {
      ids->push_back(seg.token);
      continue;
    }
    pieces.clear();
    pieces.push_back({std::string(seg.text), at_text_start && seg.text.data() == normalized.data()});
    if (pre_tokenizer_) pre_tokenizer_->PreTokenize(&pieces);
    for (const Piece& p : pieces) model_->Tokenize(p.text, ids);
  }
}

StatusOr<std::vector<int32_t>> TokenizerImpl::Encode(std::string_view text, bool add_special_tokens) const {
  if (!IsValidUtf8(text)) return InvalidArgumentError("Encode: text is not valid UTF-8");
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  for (const Segment& seg : raw_matcher_.Split(text)) {
    if (seg.token >= 0) ids.push_back(seg.token);
    else EncodeText(seg.text, seg.text.data() == text.data(), &ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

StatusOr<std::string> TokenizerImpl::DecodeBytes(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      const AddedToken& t = added_tokens_[added->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.content);
      continue;
    }
    const std::string* tok = model_->IdToToken(id);
    if (tok == nullptr) {
      return OutOfRangeError("Decode: id " + std::to_string(id) + " is not in the vocabulary (size " +
                             std::to_string(vocab_size_) + ")");
    }
    tokens.push_back(*tok);
  }
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  std::string out;
  for (const auto& part : decoder_->Decode(std::move(tokens))) out += part;
  return out;
}

StatusOr<std::string> TokenizerImpl::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  ICE_ASSIGN_OR_RETURN(std::string bytes, DecodeBytes(ids, skip_special_tokens));
  return ToValidUtf8(bytes);
}

std::optional<int32_t> TokenizerImpl::TokenToId(std::string_view token) const {
  auto it = added_by_content_.find(std::string(token));
  if (it != added_by_content_.end()) return it->second;
  return model_->TokenToId(token);
}

bool TokenizerImpl::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_tokens_[it->second].special;
}

StatusOr<std::string> TokenizerImpl::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                       bool add_generation_prompt) const {
  return FormatChat(chat_, messages, add_generation_prompt);
}

StatusOr<std::string> TokenizerImpl::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                       bool add_generation_prompt,
                                                       const ChatRenderOptions& options) const {
  return FormatChat(chat_, messages, add_generation_prompt, options);
}

}  // namespace icecache::tokenizer
