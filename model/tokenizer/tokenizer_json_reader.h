// Streaming reader for tokenizer.json. The two big members, model.vocab and model.merges (150k+
// entries each in real tokenizers), are read straight into flat vectors; everything else becomes
// a JSON DOM. model.vocab / model.merges stay in the DOM as empty placeholders of the same type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace icecache::tokenizer {

struct BpeData {
  std::vector<std::pair<std::string, int64_t>> vocab;        // in file order
  std::vector<std::pair<std::string, std::string>> merges;   // in rank order
};

// j[key] when j is an object holding key, else a null value. Returns a reference: subtrees are
// never copied (a copy of a hostile, deeply nested value would recurse deeply).
inline const nlohmann::json& JsonField(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// Parses `text`. INVALID_ARGUMENT for invalid JSON ("invalid JSON: ...") or a vocab / merges
// entry of the wrong shape (naming the entry).
Status ReadTokenizerJson(std::string_view text, nlohmann::json* doc, BpeData* data);

}  // namespace icecache::tokenizer
