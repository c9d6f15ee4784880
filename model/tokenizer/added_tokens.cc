#include "model/tokenizer/added_tokens.h"

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

bool IsWordChar(char32_t c) { return c == '_' || IsLetter(c) || IsNumber(c); }

// The code point ending at byte `end` of text (text[.. end) is valid UTF-8 there).
char32_t LastCodePoint(std::string_view text, size_t end, size_t* start) {
  size_t b = end;
  while (b > 0) {
    --b;
    if ((static_cast<unsigned char>(text[b]) & 0xC0) != 0x80) break;
  }
  size_t len;
  char32_t cp = DecodeUtf8(text, b, &len);
  *start = b;
  return cp;
}

}  // namespace

int AddedTokenMatcher::Child(int node, unsigned char c) const {
  for (const auto& [k, v] : nodes_[node].next) {
    if (k == c) return v;
  }
  return -1;
}

void AddedTokenMatcher::Add(std::string pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  int node = 0;
  for (char ch : pattern) {
    auto c = static_cast<unsigned char>(ch);
    int next = Child(node, c);
    if (next < 0) {
      next = static_cast<int>(nodes_.size());
      nodes_.push_back(Node{});
      nodes_[node].next.emplace_back(c, next);
    }
    node = next;
  }
  if (nodes_[node].token >= 0) return;  // the first token with this content wins
  nodes_[node].token = static_cast<int>(tokens_.size());
  tokens_.push_back(token);
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

std::vector<Segment> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<Segment> out;
  if (tokens_.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return out;
  }
  size_t emitted = 0;  // text before this is in out already
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    int node = 0, best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = Child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = i + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[best];
    size_t start = pos, stop = best_end;
    if (tok.single_word) {
      size_t prev_start, len;
      bool ok_left = start == 0 || !IsWordChar(LastCodePoint(text, start, &prev_start));
      bool ok_right = stop == text.size() || !IsWordChar(DecodeUtf8(text, stop, &len));
      if (!ok_left || !ok_right) {
        pos = best_end;
        continue;
      }
    }
    if (tok.lstrip) {
      while (start > emitted) {
        size_t prev_start;
        char32_t c = LastCodePoint(text, start, &prev_start);
        if (!IsWhiteSpace(c)) break;
        start = prev_start;
      }
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t len;
        char32_t c = DecodeUtf8(text, stop, &len);
        if (c == kInvalidCodePoint || !IsWhiteSpace(c)) break;
        stop += len;
      }
    }
    if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1});
    out.push_back({text.substr(start, stop - start), tok.id});
    emitted = stop;
    pos = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
  return out;
}

}  // namespace icecache::tokenizer
