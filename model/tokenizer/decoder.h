// Decoders of tokenizer.json ("decoder" field): ByteLevel, Metaspace, Replace (string pattern),
// ByteFallback, Fuse, Strip and Sequence. A decoder maps the token strings of an id sequence to
// text. Strings here are raw bytes: invalid UTF-8 is kept (the caller replaces it at the very end,
// so streaming can hold back incomplete characters). Immutable; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace icecache::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> Decode(std::vector<std::string> tokens) const = 0;
};

// Parses a "decoder" object; null gives nullptr (tokens are then joined with spaces, as Hugging
// Face does). Unsupported types are INVALID_ARGUMENT naming the type.
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j);

}  // namespace icecache::tokenizer
