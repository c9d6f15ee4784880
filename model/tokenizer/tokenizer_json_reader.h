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

// Parses `text`. INVALID_ARGUMENT for invalid JSON ("invalid JSON: ...") or a vocab / merges
// entry of the wrong shape (naming the entry).
Status ReadTokenizerJson(std::string_view text, nlohmann::json* doc, BpeData* data);

}  // namespace icecache::tokenizer
