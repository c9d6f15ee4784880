// Normalizers of tokenizer.json ("normalizer" field): NFC, NFKC, Prepend, Replace (string
// pattern), Strip (White_Space at either end) and Sequence of these. Immutable after construction; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace icecache::tokenizer {

// Unicode Normalization Form C of valid UTF-8 text (canonical decomposition, canonical ordering,
// canonical composition including Hangul; composition exclusions respected).
std::string NormalizeNfc(std::string_view text);

// Unicode Normalization Form KC of valid UTF-8 text (compatibility decomposition, then as NFC).
std::string NormalizeNfkc(std::string_view text);

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Normalize(std::string_view text) const = 0;
};

// Parses a "normalizer" JSON object. null gives nullptr (no normalizer). Unsupported types are
// INVALID_ARGUMENT naming the type.
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j);

}  // namespace icecache::tokenizer
