// BuildByteLevelBpeTokenizerJson: a small Llama-3-style tokenizer.json with merges learned greedily.
#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

struct Word {
  std::vector<int32_t> syms;
  int64_t count;
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

StatusOr<std::string> BuildByteLevelBpeTokenizerJson(const ByteLevelBpeSpec& spec) {
  if (spec.vocab_size < 256) {
    return InvalidArgumentError("BuildByteLevelBpeTokenizerJson: vocab_size " +
                                std::to_string(spec.vocab_size) + " < 256 byte tokens");
  }
  if (spec.vocab_size > 1000000) {
    return InvalidArgumentError("BuildByteLevelBpeTokenizerJson: vocab_size too large");
  }
  if (!IsValidUtf8(spec.corpus)) {
    return InvalidArgumentError("BuildByteLevelBpeTokenizerJson: corpus is not valid UTF-8");
  }
  std::unordered_set<std::string> specials_seen;
  for (const auto& s : spec.special_tokens) {
    if (s.empty() || !specials_seen.insert(s).second) {
      return InvalidArgumentError("BuildByteLevelBpeTokenizerJson: empty or repeated special token \"" + s + "\"");
    }
  }

  // Tokens are byte strings while training; ids 0..255 are the single bytes.
  std::vector<std::string> tokens(256);
  for (int b = 0; b < 256; ++b) tokens[b] = std::string(1, static_cast<char>(b));
  std::unordered_map<std::string, int32_t> token_ids;
  for (int b = 0; b < 256; ++b) token_ids[tokens[b]] = b;

  // Pre-tokenize the corpus exactly as the tokenizer will, and count words.
  ICE_ASSIGN_OR_RETURN(Regex split, Regex::Compile(kLlama3SplitPattern));
  std::map<std::string, int64_t> counts;
  {
    CodePoints cps = DecodeAll(spec.corpus);
    for (auto [b, e] : split.FindAll(cps.cps)) {
      counts[spec.corpus.substr(cps.offsets[b], cps.offsets[e] - cps.offsets[b])]++;
    }
  }
  std::vector<Word> words;
  for (const auto& [w, c] : counts) {
    Word word;
    for (char ch : w) word.syms.push_back(static_cast<uint8_t>(ch));
    word.count = c;
    if (word.syms.size() > 1) words.push_back(std::move(word));
  }

  std::vector<std::pair<int32_t, int32_t>> merges;
  auto add_merge = [&](int32_t a, int32_t b) {
    std::string merged = tokens[a] + tokens[b];
    int32_t id = static_cast<int32_t>(tokens.size());
    tokens.push_back(merged);
    token_ids[merged] = id;
    merges.emplace_back(a, b);
    return id;
  };
  while (static_cast<int>(tokens.size()) < spec.vocab_size) {
    std::unordered_map<uint64_t, int64_t> pair_counts;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) pair_counts[PairKey(w.syms[i], w.syms[i + 1])] += w.count;
    }
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [k, c] : pair_counts) {
      // Most frequent pair; ties go to the smaller (left id, right id) for determinism.
      if (c > best_count || (c == best_count && k < best)) {
        best = k;
        best_count = c;
      }
    }
    if (best_count == 0) break;
    int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xFFFFFFFF);
    int32_t id;
    auto existing = token_ids.find(tokens[a] + tokens[b]);
    if (existing != token_ids.end()) {
      // The same string was already made from another split: a second merge yields that token.
      merges.emplace_back(a, b);
      id = existing->second;
    } else {
      id = add_merge(a, b);
    }
    for (Word& w : words) {
      std::vector<int32_t> out;
      out.reserve(w.syms.size());
      for (size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == a && w.syms[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w.syms[i]);
        }
      }
      w.syms = std::move(out);
    }
    words.erase(std::remove_if(words.begin(), words.end(), [](const Word& w) { return w.syms.size() < 2; }),
                words.end());
  }
  // Corpus exhausted: extend existing tokens by printable ASCII bytes so the size is as asked.
  for (int32_t left = 0; static_cast<int>(tokens.size()) < spec.vocab_size; ++left) {
    for (int b = '!'; b <= '~' && static_cast<int>(tokens.size()) < spec.vocab_size; ++b) {
      if (!token_ids.count(tokens[left] + tokens[b])) add_merge(left, b);
    }
  }

  const int32_t n_regular = static_cast<int32_t>(tokens.size());
  Json added = Json::array();
  for (size_t i = 0; i < spec.special_tokens.size(); ++i) {
    added.push_back({{"id", n_regular + static_cast<int32_t>(i)},
                     {"content", spec.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  Json vocab = Json::object();
  // Tokens are unique, so entries are appended without ordered_map's linear duplicate search
  // (which made large vocabularies quadratic).
  auto& entries = static_cast<Json::object_t::Container&>(vocab.get_ref<Json::object_t&>());
  entries.reserve(n_regular);
  for (int32_t id = 0; id < n_regular; ++id) entries.emplace_back(BytesToByteLevel(tokens[id]), Json(id));
  Json merge_list = Json::array();
  for (auto [a, b] : merges) {
    merge_list.push_back(Json::array({BytesToByteLevel(tokens[a]), BytesToByteLevel(tokens[b])}));
  }
  Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                     {"use_regex", false}};
  Json post = byte_level;
  if (!spec.special_tokens.empty()) {
    const std::string& bos = spec.special_tokens[0];
    Json template_pp = {
        {"type", "TemplateProcessing"},
        {"single", Json::array({Json{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", Json::array({Json{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                              Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              Json{{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                              Json{{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens", {{bos, {{"id", bos}, {"ids", Json::array({n_regular})}, {"tokens", Json::array({bos})}}}}}};
    post = {{"type", "Sequence"}, {"processors", Json::array({byte_level, template_pp})}};
  }
  Json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         Json::array({Json{{"type", "Split"}, {"pattern", {{"Regex", kLlama3SplitPattern}}},
                           {"behavior", "Isolated"}, {"invert", false}},
                      byte_level})}}},
      {"post_processor", post},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
        {"byte_fallback", false}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merge_list}}}};
  return doc.dump(1);
}

}  // namespace icecache::tokenizer
