// A small backtracking regex engine over Unicode code points, for the Split pre-tokenizer patterns
// of tokenizer.json (GPT-2, Llama-3, Qwen2/3 and similar). Semantics follow Oniguruma, the engine
// Hugging Face tokenizers uses: leftmost-first alternation, greedy quantifiers with backtracking,
// \s = White_Space, \p{L} / \p{N} = general categories L* / N*.
//
// Supported: literals and escapes (\r \n \t \f \v \xHH \x{H..} \uHHHH, escaped punctuation), '.',
// classes [...] / [^...] with ranges, \s \S \p{L} \p{N} \P{..} (also \pL, \pN), groups (...) (?:...)
// (?i:...) (?i), lookahead (?=...) (?!...), alternation, quantifiers ? * + {n} {n,} {n,m} and their
// lazy forms. Anything else (anchors, \d, \w, \b, backreferences, lookbehind, possessive
// quantifiers, nested classes) is rejected at Compile time with INVALID_ARGUMENT naming it.
//
// A compiled Regex is immutable; const methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace icecache::tokenizer {

class Regex {
 public:
  static StatusOr<Regex> Compile(std::string_view pattern);

  // All non-overlapping, non-empty matches in `cps`, left to right, as [begin, end) indices into
  // `cps` (an empty match at a position is skipped).
  std::vector<std::pair<size_t, size_t>> FindAll(const std::vector<char32_t>& cps) const;

  // The end of the match anchored at `start` (leftmost-first), or -1 when none.
  ptrdiff_t MatchAt(const std::vector<char32_t>& cps, size_t start) const;

  struct Program;  // compiled form (regex.cc)

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace icecache::tokenizer
