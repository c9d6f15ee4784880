#include "model/tokenizer/pretokenizer.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/tokenizer_json_reader.h"
#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Cuts `piece` around `matches` ([begin, end) code point indices, in order, not overlapping) as
// HF's SplitDelimiterBehavior does.
void SplitAround(const CodePoints& cps, const std::vector<std::pair<size_t, size_t>>& matches, Behavior behavior,
                 Piece piece, std::vector<Piece>* out) {
  // Spans as [begin, end) byte offsets, each flagged as match or gap.
  std::vector<std::pair<size_t, size_t>> spans;
  std::vector<bool> is_match;
  size_t last = 0;
  for (auto [b, e] : matches) {
    size_t bb = cps.offsets[b], eb = cps.offsets[e];
    if (bb > last) {
      spans.emplace_back(last, bb);
      is_match.push_back(false);
    }
    spans.emplace_back(bb, eb);
    is_match.push_back(true);
    last = eb;
  }
  if (last < piece.text.size()) {
    spans.emplace_back(last, piece.text.size());
    is_match.push_back(false);
  }
  std::vector<std::pair<size_t, size_t>> parts;
  switch (behavior) {
    case Behavior::kIsolated:
      parts.swap(spans);
      break;
    case Behavior::kContiguous:  // adjacent matches form one piece
      for (size_t i = 0; i < spans.size(); ++i) {
        if (is_match[i] && i > 0 && is_match[i - 1]) parts.back().second = spans[i].second;
        else parts.push_back(spans[i]);
      }
      break;
    case Behavior::kRemoved:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (!is_match[i]) parts.push_back(spans[i]);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (is_match[i] && !parts.empty() && !is_match[i - 1]) parts.back().second = spans[i].second;
        else parts.push_back(spans[i]);
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && is_match[i - 1] && !is_match[i] && !parts.empty()) parts.back().second = spans[i].second;
        else parts.push_back(spans[i]);
      }
      break;
  }
  for (auto [b, e] : parts) {
    if (e > b) out->push_back({piece.text.substr(b, e - b), piece.at_text_start && b == 0});
  }
}

void SplitPiece(const Regex& re, Behavior behavior, Piece piece, std::vector<Piece>* out) {
  CodePoints cps = DecodeAll(piece.text);
  SplitAround(cps, re.FindAll(cps.cps), behavior, std::move(piece), out);
}

// HF Whitespace: the matches of \w+|[^\w\s]+ (runs of word characters, runs of other non-space
// characters); white space is dropped.
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    for (auto& p : *pieces) {
      CodePoints cps = DecodeAll(p.text);
      const size_t n = cps.cps.size();
      for (size_t i = 0; i < n;) {
        if (IsWhiteSpace(cps.cps[i])) {
          ++i;
          continue;
        }
        const bool word = IsRegexWordChar(cps.cps[i]);
        size_t j = i + 1;
        while (j < n && !IsWhiteSpace(cps.cps[j]) && IsRegexWordChar(cps.cps[j]) == word) ++j;
        out.push_back({p.text.substr(cps.offsets[i], cps.offsets[j] - cps.offsets[i]), p.at_text_start && i == 0});
        i = j;
      }
    }
    *pieces = std::move(out);
  }
};

// HF Punctuation: splits around each punctuation character (ASCII punctuation or general
// category P*) with the given behaviour.
class PunctuationPreTokenizer : public PreTokenizer {
 public:
  explicit PunctuationPreTokenizer(Behavior behavior) : behavior_(behavior) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    for (auto& p : *pieces) {
      CodePoints cps = DecodeAll(p.text);
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t i = 0; i < cps.cps.size(); ++i) {
        const char32_t c = cps.cps[i];
        const bool ascii_punct = c < 0x80 && std::ispunct(static_cast<int>(c));
        if (ascii_punct || IsPunctuation(c)) matches.emplace_back(i, i + 1);
      }
      SplitAround(cps, matches, behavior_, std::move(p), &out);
    }
    *pieces = std::move(out);
  }

 private:
  Behavior behavior_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex re, Behavior behavior) : re_(std::move(re)), behavior_(behavior) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    for (auto& p : *pieces) SplitPiece(re_, behavior_, std::move(p), &out);
    *pieces = std::move(out);
  }

 private:
  Regex re_;
  Behavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    for (auto& p : *pieces) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (re_) SplitPiece(*re_, Behavior::kIsolated, std::move(p), &out);
      else out.push_back(std::move(p));
    }
    for (auto& p : out) p.text = BytesToByteLevel(p.text);
    *pieces = std::move(out);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::optional<Regex> re_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    for (auto& p : *pieces) {
      std::string t;
      for (char c : p.text) {
        if (c == ' ') t += replacement_;
        else t.push_back(c);
      }
      bool starts = t.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_text_start))) {
        t = replacement_ + t;
      }
      if (!split_) {
        out.push_back({std::move(t), p.at_text_start});
        continue;
      }
      // MergedWithNext on the replacement character: "▁a▁▁b" -> "▁a", "▁", "▁b".
      size_t begin = 0;
      size_t pos = t.find(replacement_, 1);
      while (pos != std::string::npos) {
        out.push_back({t.substr(begin, pos - begin), p.at_text_start && begin == 0});
        begin = pos;
        pos = t.find(replacement_, pos + replacement_.size());
      }
      if (begin < t.size()) out.push_back({t.substr(begin), p.at_text_start && begin == 0});
    }
    *pieces = std::move(out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }
  bool byte_level() const override {
    for (const auto& p : parts_) {
      if (p->byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

bool GetBool(const nlohmann::json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

// A regex matching `literal` exactly.
std::string EscapeLiteral(const std::string& literal) {
  std::string out;
  CodePoints cps = DecodeAll(literal);
  for (char32_t c : cps.cps) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\x{%X}", static_cast<unsigned>(c));
    out += buf;
  }
  return out;
}

// The "behavior" field; `fallback` when absent ("" = required).
StatusOr<Behavior> ParseBehavior(const nlohmann::json& j, const char* type, const char* fallback) {
  std::string behavior = j.contains("behavior") && j["behavior"].is_string() ? j["behavior"].get<std::string>() : fallback;
  if (behavior == "Isolated") return Behavior::kIsolated;
  if (behavior == "Removed") return Behavior::kRemoved;
  if (behavior == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (behavior == "MergedWithNext") return Behavior::kMergedWithNext;
  if (behavior == "Contiguous") return Behavior::kContiguous;
  return InvalidArgumentError(std::string("pre_tokenizer ") + type + ": unsupported behavior \"" + behavior + "\"");
}

}  // namespace

// Sequences may nest; bounded so a hostile file cannot exhaust the stack.
constexpr int kMaxSequenceDepth = 32;
static thread_local int sequence_depth = 0;

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& j) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgumentError("pre_tokenizer: expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return InvalidArgumentError("pre_tokenizer Sequence: missing array \"pretokenizers\"");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& sub : j["pretokenizers"]) {
      if (++sequence_depth > kMaxSequenceDepth) {
        --sequence_depth;
        return InvalidArgumentError("pre_tokenizer Sequence: nested too deeply");
      }
      auto part_or = ParsePreTokenizer(sub);
      --sequence_depth;
      if (!part_or.ok()) return part_or.status();
      auto part = std::move(part_or).value();
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    const nlohmann::json& pattern = JsonField(j, "pattern");
    std::string regex_text;
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex_text = pattern["Regex"].get<std::string>();
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      regex_text = EscapeLiteral(pattern["String"].get<std::string>());
    } else {
      return InvalidArgumentError("pre_tokenizer Split: \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (GetBool(j, "invert", false)) {
      return InvalidArgumentError("pre_tokenizer Split: invert = true is not supported");
    }
    ICE_ASSIGN_OR_RETURN(Behavior b, ParseBehavior(j, "Split", ""));
    auto re = Regex::Compile(regex_text);
    if (!re.ok()) return re.status().WithContext("pre_tokenizer Split");
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re).value(), b));
  }
  if (type == "Digits") {
    // Rust's char::is_numeric (general categories Nd, Nl, No), one piece per digit or per run.
    ICE_ASSIGN_OR_RETURN(Regex re, Regex::Compile(GetBool(j, "individual_digits", false) ? "\\p{N}" : "\\p{N}+"));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), Behavior::kIsolated));
  }
  if (type == "Whitespace") return std::unique_ptr<PreTokenizer>(new WhitespacePreTokenizer());
  if (type == "Punctuation") {
    ICE_ASSIGN_OR_RETURN(Behavior b, ParseBehavior(j, "Punctuation", "Isolated"));
    return std::unique_ptr<PreTokenizer>(new PunctuationPreTokenizer(b));
  }
  if (type == "WhitespaceSplit") {
    // Pieces between runs of White_Space (Rust's char::is_whitespace); the white space is dropped.
    ICE_ASSIGN_OR_RETURN(Regex re, Regex::Compile("\\s+"));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), Behavior::kRemoved));
  }
  if (type == "ByteLevel") {
    std::optional<Regex> re;
    if (GetBool(j, "use_regex", true)) {
      ICE_ASSIGN_OR_RETURN(Regex compiled, Regex::Compile(kGpt2SplitPattern));
      re = std::move(compiled);
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(GetBool(j, "add_prefix_space", true), std::move(re)));
  }
  if (type == "Metaspace") {
    std::string replacement = j.contains("replacement") && j["replacement"].is_string()
                                  ? j["replacement"].get<std::string>() : "\xE2\x96\x81";
    if (replacement.empty()) return InvalidArgumentError("pre_tokenizer Metaspace: empty replacement");
    auto prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always") prepend = MetaspacePreTokenizer::Prepend::kAlways;
      else if (s == "first") prepend = MetaspacePreTokenizer::Prepend::kFirst;
      else if (s == "never") prepend = MetaspacePreTokenizer::Prepend::kNever;
      else return InvalidArgumentError("pre_tokenizer Metaspace: unknown prepend_scheme \"" + s + "\"");
    } else if (!GetBool(j, "add_prefix_space", true)) {
      prepend = MetaspacePreTokenizer::Prepend::kNever;
    }
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(replacement, prepend, GetBool(j, "split", true)));
  }
  return InvalidArgumentError("unsupported pre_tokenizer type \"" + type +
                              "\" (supported: Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation, "
                              "Sequence)");
}

}  // namespace icecache::tokenizer
