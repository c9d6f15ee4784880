#include "model/tokenizer/normalizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer_json_reader.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_tables.h"

namespace icecache::tokenizer {
namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

bool NfcUnsafe(char32_t cp) {
  if (cp < 0x300) return false;
  const auto* table = tables::kNfcUnsafeRanges;
  const auto* end = table + tables::kNfcUnsafeRangesSize;
  const auto* it = std::upper_bound(table, end, cp,
                                    [](char32_t c, const tables::Range& r) { return c < r.lo; });
  return it != table && cp <= (it - 1)->hi;
}

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = tables::kDecompositions + tables::kDecompositionsSize;
  const auto* it = std::lower_bound(tables::kDecompositions, end, cp,
                                    [](const tables::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  Decompose(it->first, out);
  if (it->second != 0) Decompose(it->second, out);
}

// Returns the primary composite of (a, b), or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* end = tables::kCompositions + tables::kCompositionsSize;
  const auto* it = std::lower_bound(
      tables::kCompositions, end, std::make_pair(a, b),
      [](const tables::Composition& c, const std::pair<char32_t, char32_t>& k) {
        return c.first < k.first || (c.first == k.first && c.second < k.second);
      });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

class NfcNormalizer : public Normalizer {
 public:
  std::string Normalize(std::string_view text) const override { return NormalizeNfc(text); }
};

class NfkcNormalizer : public Normalizer {
 public:
  std::string Normalize(std::string_view text) const override { return NormalizeNfkc(text); }
};

// Strips White_Space (Rust's char::is_whitespace) from either end.
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string_view text) const override {
    CodePoints cps = DecodeAll(text);
    size_t b = 0, e = cps.cps.size();
    while (left_ && b < e && IsWhiteSpace(cps.cps[b])) ++b;
    while (right_ && e > b && IsWhiteSpace(cps.cps[e - 1])) --e;
    return std::string(text.substr(cps.offsets[b], cps.offsets[e] - cps.offsets[b]));
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string_view text) const override {
    if (text.empty()) return std::string();
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string_view text) const override {
    std::string out;
    size_t pos = 0;
    while (true) {
      size_t hit = text.find(pattern_, pos);
      if (hit == std::string_view::npos) break;
      out.append(text.substr(pos, hit - pos));
      out.append(content_);
      pos = hit + pattern_.size();
    }
    out.append(text.substr(pos));
    return out;
  }

 private:
  std::string pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string Normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->Normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::string NormalizeNfc(std::string_view text) {
  bool all_safe = true;
  for (size_t pos = 0; pos < text.size();) {
    auto b = static_cast<unsigned char>(text[pos]);
    if (b < 0x80) {
      ++pos;
      continue;
    }
    size_t len;
    char32_t cp = DecodeUtf8(text, pos, &len);
    pos += len;
    if (cp == kInvalidCodePoint || NfcUnsafe(cp)) {
      all_safe = false;
      break;
    }
  }
  if (all_safe) return std::string(text);

  CodePoints in = DecodeAll(text);
  std::vector<char32_t> d;
  d.reserve(in.cps.size() + 8);
  for (char32_t cp : in.cps) Decompose(cp, &d);

  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (CombiningClass(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && CombiningClass(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }

  // Canonical composition (UAX #15).
  if (!d.empty()) {
    size_t starter = 0;
    int last_class = CombiningClass(d[0]);
    if (last_class != 0) last_class = 256;  // no starter yet: nothing may compose with d[0]
    size_t out = 1;
    for (size_t i = 1; i < d.size(); ++i) {
      char32_t ch = d[i];
      int cls = CombiningClass(ch);
      char32_t composite = Compose(d[starter], ch);
      if (composite != 0 && (last_class < cls || last_class == 0)) {
        d[starter] = composite;
        continue;
      }
      if (cls == 0) starter = out;
      last_class = cls;
      d[out++] = ch;
    }
    d.resize(out);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t cp : d) AppendUtf8(cp, &result);
  return result;
}

std::string NormalizeNfkc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  // NFKC(s) = NFC(s with each compatibility character replaced by its full NFKD): the rest of
  // the decomposition is canonical, which NFC does.
  CodePoints in = DecodeAll(text);
  std::string expanded;
  expanded.reserve(text.size() + 8);
  const auto* end = tables::kCompatDecompositions + tables::kCompatDecompositionsSize;
  for (char32_t cp : in.cps) {
    const auto* it = std::lower_bound(tables::kCompatDecompositions, end, cp,
                                      [](const tables::CompatDecomposition& d, char32_t c) { return d.cp < c; });
    if (it == end || it->cp != cp) {
      AppendUtf8(cp, &expanded);
      continue;
    }
    for (uint32_t k = 0; k < it->length; ++k) AppendUtf8(tables::kCompatData[it->offset + k], &expanded);
  }
  return NormalizeNfc(expanded);
}

// Sequences may nest; bounded so a hostile file cannot exhaust the stack.
constexpr int kMaxSequenceDepth = 32;
static thread_local int sequence_depth = 0;

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgumentError("normalizer: expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "NFC") return std::unique_ptr<Normalizer>(new NfcNormalizer());
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new NfkcNormalizer());
  if (type == "Strip") {
    auto flag = [&](const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
    return std::unique_ptr<Normalizer>(new StripNormalizer(flag("strip_left"), flag("strip_right")));
  }
  if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string()) {
      return InvalidArgumentError("normalizer Prepend: missing string \"prepend\"");
    }
    return std::unique_ptr<Normalizer>(new PrependNormalizer(j["prepend"].get<std::string>()));
  }
  if (type == "Replace") {
    const nlohmann::json& pattern = JsonField(j, "pattern");
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        !j.contains("content") || !j["content"].is_string()) {
      return InvalidArgumentError(
          "normalizer Replace: only {\"pattern\": {\"String\": ...}, \"content\": ...} is supported");
    }
    std::string from = pattern["String"].get<std::string>();
    if (from.empty()) return InvalidArgumentError("normalizer Replace: empty pattern");
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(from, j["content"].get<std::string>()));
  }
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return InvalidArgumentError("normalizer Sequence: missing array \"normalizers\"");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& sub : j["normalizers"]) {
      if (++sequence_depth > kMaxSequenceDepth) {
        --sequence_depth;
        return InvalidArgumentError("normalizer Sequence: nested too deeply");
      }
      auto part_or = ParseNormalizer(sub);
      --sequence_depth;
      if (!part_or.ok()) return part_or.status();
      auto part = std::move(part_or).value();
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return InvalidArgumentError("unsupported normalizer type \"" + type +
                              "\" (supported: NFC, NFKC, Prepend, Replace, Strip, Sequence)");
}

}  // namespace icecache::tokenizer
