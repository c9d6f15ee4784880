// Added tokens of tokenizer.json ("added_tokens"): strings matched in the text as whole tokens
// before the normalizer/pre-tokenizer/model run. Matching is leftmost-longest; lstrip/rstrip
// extend a match over neighbouring white space; single_word requires word boundaries around it.
// Immutable after Build; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace icecache::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A piece of input: either plain text (token < 0) or one matched added token.
struct Segment {
  std::string_view text;  // the text covered (for a token: including stripped white space)
  int32_t token = -1;
};

class AddedTokenMatcher {
 public:
  // `patterns` are (string to look for, token id) pairs with the token's flags.
  void Add(std::string pattern, const AddedToken& token);
  bool empty() const { return tokens_.empty(); }

  // Splits text into plain and token segments (in order, covering all of text).
  std::vector<Segment> Split(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int token = -1;  // index into tokens_
  };
  int Child(int node, unsigned char c) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace icecache::tokenizer
