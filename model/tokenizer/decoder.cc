#include "model/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer_json_reader.h"
#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    std::string out, bytes;
    for (const auto& t : tokens) {
      // A token outside the alphabet (e.g. an added token with a space) passes through as is.
      if (ByteLevelToBytes(t, &bytes)) out += bytes;
      else out += t;
    }
    return {out};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          // As Hugging Face does: the first token drops its replacement characters entirely.
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      std::string out;
      size_t pos = 0;
      while (true) {
        size_t hit = t.find(from_, pos);
        if (hit == std::string::npos) break;
        out.append(t, pos, hit - pos);
        out += to_;
        pos = hit + from_.size();
      }
      out.append(t, pos);
      t = std::move(out);
    }
    return tokens;
  }

 private:
  std::string from_, to_;
};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

class ByteFallbackDecoder : public Decoder {
 public:
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && HexDigit(t[3]) >= 0 &&
          HexDigit(t[4]) >= 0) {
        t = std::string(1, static_cast<char>(HexDigit(t[3]) * 16 + HexDigit(t[4])));
      }
    }
    return tokens;
  }
};

class FuseDecoder : public Decoder {
 public:
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    std::string out;
    for (const auto& t : tokens) out += t;
    return {out};
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t i = 0; i < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++i) {
        b += content_.size();
      }
      for (size_t i = 0; i < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0; ++i) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
    return tokens;
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::vector<std::string> Decode(std::vector<std::string> tokens) const override {
    for (const auto& p : parts_) tokens = p->Decode(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

// Sequences may nest; bounded so a hostile file cannot exhaust the stack.
constexpr int kMaxSequenceDepth = 32;
static thread_local int sequence_depth = 0;

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgumentError("decoder: expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Metaspace") {
    std::string replacement = j.contains("replacement") && j["replacement"].is_string()
                                  ? j["replacement"].get<std::string>() : "\xE2\x96\x81";
    bool strip_first = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    } else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean()) {
      strip_first = j["add_prefix_space"].get<bool>();
    }
    if (replacement.empty()) return InvalidArgumentError("decoder Metaspace: empty replacement");
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(replacement, strip_first));
  }
  if (type == "Replace") {
    const nlohmann::json& pattern = JsonField(j, "pattern");
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        !j.contains("content") || !j["content"].is_string() || pattern["String"].get<std::string>().empty()) {
      return InvalidArgumentError("decoder Replace: only a non-empty {\"String\": ...} pattern with a content is supported");
    }
    return std::unique_ptr<Decoder>(
        new ReplaceDecoder(pattern["String"].get<std::string>(), j["content"].get<std::string>()));
  }
  if (type == "Strip") {
    if (!j.contains("content") || !j["content"].is_string() || j["content"].get<std::string>().empty() ||
        !j.contains("start") || !j["start"].is_number_unsigned() || !j.contains("stop") ||
        !j["stop"].is_number_unsigned()) {
      return InvalidArgumentError("decoder Strip: needs \"content\", \"start\" and \"stop\"");
    }
    return std::unique_ptr<Decoder>(new StripDecoder(j["content"].get<std::string>(),
                                                     std::min<size_t>(j["start"].get<size_t>(), 1 << 20),
                                                     std::min<size_t>(j["stop"].get<size_t>(), 1 << 20)));
  }
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) {
      return InvalidArgumentError("decoder Sequence: missing array \"decoders\"");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& sub : j["decoders"]) {
      if (++sequence_depth > kMaxSequenceDepth) {
        --sequence_depth;
        return InvalidArgumentError("decoder Sequence: nested too deeply");
      }
      auto part_or = ParseDecoder(sub);
      --sequence_depth;
      if (!part_or.ok()) return part_or.status();
      auto part = std::move(part_or).value();
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  return InvalidArgumentError("unsupported decoder type \"" + type +
                              "\" (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
}

}  // namespace icecache::tokenizer
