#include "model/tokenizer/gguf_vocab.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/tokenizer_impl.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::json;

constexpr int64_t kTypeControl = 3;
constexpr int64_t kTypeUserDefined = 4;

Json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

Json SplitRegex(const char* pattern) {
  return {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}

StatusOr<Json> Gpt2PreTokenizer(const GgufVocab& v) {
  const std::string& pre = v.pre;
  if (pre.empty() || pre == "gpt2" || pre == "default") return ByteLevel(true);
  if (pre == "smollm") {
    return Json{{"type", "Sequence"},
                {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, ByteLevel(true)}}};
  }
  if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe" || pre == "dbrx") {
    return Json{{"type", "Sequence"}, {"pretokenizers", {SplitRegex(kLlama3SplitPattern), ByteLevel(false)}}};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    return Json{{"type", "Sequence"}, {"pretokenizers", {SplitRegex(kQwen2SplitPattern), ByteLevel(false)}}};
  }
  return InvalidArgumentError(v.source + ": tokenizer.ggml.pre '" + pre +
                              "' is not supported (supported: gpt2, default, smollm, llama-bpe, llama3, smaug-bpe, "
                              "dbrx, qwen2, deepseek-r1-qwen)");
}

// SentencePiece BPE merges from scores: every split of a token into two tokens, ranked by the
// merged token's score (descending), then its id, then the left part's length.
std::vector<std::pair<std::string, std::string>> MergesFromScores(const GgufVocab& v) {
  std::unordered_map<std::string_view, int64_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<int64_t>(i));
  struct Merge {
    float score;
    int64_t id;
    size_t split;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (!v.token_types.empty() && v.token_types[i] != 1) continue;
    std::string_view t = v.tokens[i];
    for (size_t k = 1; k < t.size(); ++k) {
      if (ids.count(t.substr(0, k)) && ids.count(t.substr(k)))
        merges.push_back({v.scores[i], static_cast<int64_t>(i), k});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.id != b.id) return a.id < b.id;
    return a.split < b.split;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& m : merges) {
    std::string_view t = v.tokens[m.id];
    out.emplace_back(std::string(t.substr(0, m.split)), std::string(t.substr(m.split)));
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> BuildGgufTokenizer(const GgufVocab& v) {
  const std::string& src = v.source;
  const int64_t n = static_cast<int64_t>(v.tokens.size());
  if (n == 0) return InvalidArgumentError(src + ": tokenizer.ggml.tokens is empty");
  if (!v.token_types.empty() && static_cast<int64_t>(v.token_types.size()) != n) {
    return InvalidArgumentError(src + ": tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) +
                                " entries for " + std::to_string(n) + " tokens");
  }
  for (const auto& [name, id] :
       {std::pair{"bos", v.bos_id}, std::pair{"eos", v.eos_id}, std::pair{"unknown", v.unk_id}}) {
    if (id && (*id < 0 || *id >= n)) {
      return InvalidArgumentError(src + ": tokenizer.ggml." + name + "_token_id " + std::to_string(*id) +
                                  " is outside the vocabulary of " + std::to_string(n));
    }
  }
  Json doc = Json::object();
  BpeData data;
  data.vocab.reserve(n);
  for (int64_t i = 0; i < n; ++i) data.vocab.emplace_back(std::string(v.tokens[i]), i);
  Json added = Json::array();
  for (int64_t i = 0; i < n && !v.token_types.empty(); ++i) {
    const int64_t type = v.token_types[i];
    if (type != kTypeControl && type != kTypeUserDefined) continue;
    if (v.tokens[i].empty()) continue;
    const bool special = type == kTypeControl;
    added.push_back({{"id", i},
                     {"content", std::string(v.tokens[i])},
                     {"special", special},
                     {"normalized", !special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false}});
  }
  doc["added_tokens"] = std::move(added);
  bool add_bos_default = false;
  if (v.model == "gpt2") {
    for (size_t k = 0; k < v.merges.size(); ++k) {
      std::string_view m = v.merges[k];
      const size_t sp = m.find(' ');
      if (sp == std::string_view::npos || sp == 0 || sp + 1 >= m.size() ||
          m.find(' ', sp + 1) != std::string_view::npos) {
        return InvalidArgumentError(src + ": tokenizer.ggml.merges[" + std::to_string(k) + "] is not \"left right\"");
      }
      data.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
    }
    doc["model"] = {{"type", "BPE"},          {"vocab", Json::object()}, {"merges", Json::array()},
                    {"byte_fallback", false}, {"fuse_unk", false},       {"ignore_merges", false}};
    ICE_ASSIGN_OR_RETURN(doc["pre_tokenizer"], Gpt2PreTokenizer(v));
    doc["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  } else if (v.model == "llama") {
    if (static_cast<int64_t>(v.scores.size()) != n) {
      return InvalidArgumentError(src + ": tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                                  " entries for " + std::to_string(n) + " tokens");
    }
    data.merges = MergesFromScores(v);
    Json model = {{"type", "BPE"},         {"vocab", Json::object()}, {"merges", Json::array()},
                  {"byte_fallback", true}, {"fuse_unk", true},        {"ignore_merges", false}};
    if (v.unk_id) model["unk_token"] = std::string(v.tokens[*v.unk_id]);
    doc["model"] = std::move(model);
    const std::string space = "\xE2\x96\x81";
    Json normalizers = Json::array();
    if (v.add_space_prefix.value_or(true)) normalizers.push_back({{"type", "Prepend"}, {"prepend", space}});
    normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}});
    doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", std::move(normalizers)}};
    Json decoders = {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (v.add_space_prefix.value_or(true))
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1u}, {"stop", 0u}});
    doc["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
    add_bos_default = true;
  } else {
    return InvalidArgumentError(src + ": tokenizer.ggml.model '" + v.model +
                                "' is not supported (supported: gpt2, llama)");
  }
  Json config = Json::object();
  if (v.bos_id) config["bos_token"] = std::string(v.tokens[*v.bos_id]);
  if (v.eos_id) config["eos_token"] = std::string(v.tokens[*v.eos_id]);
  config["add_bos_token"] = v.add_bos.value_or(add_bos_default);
  config["add_eos_token"] = v.add_eos.value_or(false);
  if (!v.chat_template.empty()) config["chat_template"] = v.chat_template;
  auto t = BuildTokenizer(std::move(doc), std::move(data), config, nullptr, src, src);
  if (!t.ok()) return t.status();
  return std::move(t).value();
}

}  // namespace icecache::tokenizer
