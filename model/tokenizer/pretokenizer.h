// Pre-tokenizers of tokenizer.json ("pre_tokenizer" field): Split (regex or string pattern),
// ByteLevel, Metaspace, Digits (individual_digits or runs), Whitespace (\w+|[^\w\s]+),
// WhitespaceSplit, Punctuation (Unicode P* and ASCII punctuation, with a behavior) and Sequence. A pre-tokenizer cuts a normalized text segment into pieces
// the model encodes one by one. Immutable after construction; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace icecache::tokenizer {

// Split patterns of well-known tokenizers.
inline constexpr char kLlama3SplitPattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
inline constexpr char kQwen2SplitPattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// What ByteLevel(use_regex = true) splits with.
inline constexpr char kGpt2SplitPattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct Piece {
  std::string text;
  bool at_text_start;  // the piece begins at offset 0 of the original input (Metaspace "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces *pieces by their sub-pieces (each piece is handled on its own).
  virtual void PreTokenize(std::vector<Piece>* pieces) const = 0;
  // True when pieces come out in the ByteLevel alphabet (the model vocabulary uses it).
  virtual bool byte_level() const { return false; }
};

// Parses a "pre_tokenizer" JSON object; null gives nullptr. Unsupported types, behaviours or
// regex constructs are INVALID_ARGUMENT naming them.
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& j);

}  // namespace icecache::tokenizer
