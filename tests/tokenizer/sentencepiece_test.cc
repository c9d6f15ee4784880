// SentencePiece-style BPE (Llama-2 / Mistral layout) on a small hand-made tokenizer.json:
// Prepend+Replace normalizer or Metaspace pre-tokenizer, byte_fallback <0xNN> tokens, merges by
// rank, unk/fuse_unk, and the Replace/ByteFallback/Fuse/Strip and Metaspace decoders.
#include <cstdio>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::json;
const std::string kSp = "\xE2\x96\x81";  // U+2581

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"l", "l"},    {kSp, "h"},          {"e", "ll"},          {kSp + "h", "ell"}, {kSp + "hell", "o"},
    {"o", "r"},    {kSp, "w"},          {kSp + "w", "or"},    {"l", "d"},         {kSp + "wor", "ld"},
    {kSp, kSp},    {"a", "b"},          {kSp, "ab"},
};

Json MakeModel(bool byte_fallback, bool fuse_unk) {
  Json vocab = Json::object();
  int id = 0;
  for (const char* s : {"<unk>", "<s>", "</s>"}) vocab[s] = id++;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = id++;
  }
  for (std::string s : {kSp, std::string("h"), std::string("e"), std::string("l"), std::string("o"),
                        std::string("w"), std::string("r"), std::string("d"), std::string("a"), std::string("b")}) {
    vocab[s] = id++;
  }
  Json merges = Json::array();
  for (const auto& [a, b] : kMerges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    merges.push_back(a + " " + b);  // the older "a b" string form
  }
  return {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr}, {"fuse_unk", fuse_unk}, {"byte_fallback", byte_fallback},
          {"vocab", vocab}, {"merges", merges}};
}

Json AddedTokens() {
  Json added = Json::array();
  int id = 0;
  for (const char* s : {"<unk>", "<s>", "</s>"}) {
    added.push_back({{"id", id++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  return added;
}

Json BosTemplate() {
  return {{"type", "TemplateProcessing"},
          {"single", Json::array({Json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                  Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"pair", Json::array()},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
}

// Llama-2 layout: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer.
Json Llama2Json(bool byte_fallback = true, bool fuse_unk = true) {
  return {{"version", "1.0"},
          {"added_tokens", AddedTokens()},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", Json::array({Json{{"type", "Prepend"}, {"prepend", kSp}},
                                         Json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}}})}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", BosTemplate()},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", kSp}}}, {"content", " "}},
                                      Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}},
                                      Json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
          {"model", MakeModel(byte_fallback, fuse_unk)}};
}

// Newer Mistral layout: Metaspace pre-tokenizer (prepend_scheme "first") and Metaspace decoder.
Json MetaspaceJson() {
  Json j = Llama2Json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", Json::array({Json{{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "first"}},
                                            Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}}})}};
  return j;
}

// Independent reference: split into characters (byte tokens for characters outside the vocab),
// then repeatedly merge the adjacent pair with the lowest rank, leftmost first.
std::vector<int32_t> BruteForce(const Json& model, const std::string& normalized) {
  std::map<std::string, int32_t> vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) vocab[it.key()] = it.value();
  std::vector<std::string> syms;
  for (size_t i = 0; i < normalized.size();) {
    auto c = static_cast<unsigned char>(normalized[i]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    std::string ch = normalized.substr(i, len);
    i += len;
    if (vocab.count(ch)) {
      syms.push_back(ch);
    } else {
      for (unsigned char b : ch) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        syms.push_back(name);
      }
    }
  }
  while (true) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      for (size_t r = 0; r < kMerges.size() && r < best; ++r) {
        if (kMerges[r].first == syms[i] && kMerges[r].second == syms[i + 1]) {
          best = r;
          at = i;
        }
      }
    }
    if (best == SIZE_MAX) break;
    syms[at] += syms[at + 1];
    syms.erase(syms.begin() + at + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& s : syms) ids.push_back(vocab.at(s));
  return ids;
}

std::unique_ptr<Tokenizer> LoadJson(const Json& j) {
  auto dir = testing::TestDir();
  auto t = Tokenizer::Load(testing::WriteFile(dir / "tokenizer.json", j.dump()));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

TEST(SentencePieceTest, Llama2LayoutMatchesBruteForceAndHandIds) {
  Json j = Llama2Json();
  auto tok = LoadJson(j);
  ASSERT_NE(tok, nullptr);
  auto id = [&](const std::string& s) { return j["model"]["vocab"][s].get<int32_t>(); };
  // Worked by hand: "▁hello▁world" -> ▁ h e l l o ▁ w o r l d -> ll, ▁h, ell, ▁hell, ▁hello, or, ▁w, ▁wor, ld, ▁world.
  EXPECT_EQ(*tok->Encode("hello world"), std::vector<int32_t>({id(kSp + "hello"), id(kSp + "world")}));
  // "é" is not in the vocab: its two UTF-8 bytes fall back to <0xC3> <0xA9> (ids 3 + byte).
  EXPECT_EQ(*tok->Encode("h\xC3\xA9"), std::vector<int32_t>({id(kSp + "h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(*tok->Encode("hello", /*add_special_tokens=*/true), std::vector<int32_t>({1, id(kSp + "hello")}));
  EXPECT_EQ(*tok->Encode(""), std::vector<int32_t>());

  for (std::string text : {"hello world", "  hello   world  ", "ab abab hold", "world\xF0\x9F\x98\x80 h\xC3\xA9llo",
                           "\xE4\xB8\xAD\xE6\x96\x87 and more", "hellohello", "w o r l d"}) {
    std::string normalized = kSp + Replace(text, " ", kSp);
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, BruteForce(j["model"], normalized)) << text;
    // The Strip decoder removes the space the normalizer prepended.
    EXPECT_EQ(*tok->Decode(*ids), text) << text;
  }
  // Added tokens split the text; as in Hugging Face, Prepend applies to every piece between them.
  EXPECT_EQ(*tok->Encode("hello</s>hello"),
            std::vector<int32_t>({id(kSp + "hello"), 2, id(kSp + "hello")}));
  std::vector<int32_t> ids = {1, id(kSp + "hello"), 2};
  EXPECT_EQ(*tok->Decode(ids), "<s> hello</s>");
  EXPECT_EQ(*tok->Decode(ids, /*skip_special_tokens=*/true), "hello");
  // A lone continuation byte decodes to U+FFFD.
  std::vector<int32_t> broken = {id(kSp + "h"), 3 + 0xA9};
  EXPECT_EQ(*tok->Decode(broken), "h\xEF\xBF\xBD");
  EXPECT_EQ(tok->bos_id(), 1);
  // Decodes around added tokens, as Hugging Face tokenizers 0.23 gives them for this same file.
  EXPECT_EQ(*tok->Decode(*tok->Encode("hello</s>hello")), "hello</s> hello");
  EXPECT_EQ(*tok->Decode(*tok->Encode("hello</s>hello"), true), "hello hello");
  EXPECT_EQ(*tok->Decode(*tok->Encode("</s>hello"), true), "hello");
}

TEST(SentencePieceTest, MetaspaceLayout) {
  Json j = MetaspaceJson();
  auto tok = LoadJson(j);
  ASSERT_NE(tok, nullptr);
  auto id = [&](const std::string& s) { return j["model"]["vocab"][s].get<int32_t>(); };
  EXPECT_EQ(*tok->Encode("hello world"), std::vector<int32_t>({id(kSp + "hello"), id(kSp + "world")}));
  // prepend_scheme "first": no ▁ after an added token.
  EXPECT_EQ(*tok->Encode("</s>hello"), std::vector<int32_t>({2, id("h"), id("ell"), id("o")}));
  // Checked with Hugging Face tokenizers 0.23: the first token's ▁ vanishes entirely on decode.
  auto spaced = *tok->Encode("  hello   world  ");
  EXPECT_EQ(spaced, std::vector<int32_t>({id(kSp), id(kSp + "hello"), id(kSp + kSp), id(kSp + "world"), id(kSp + kSp)}));
  EXPECT_EQ(*tok->Decode(spaced), " hello   world  ");
  EXPECT_EQ(*tok->Decode(*tok->Encode("hello</s>hello")), "hello</s>hello");
  for (std::string text : {"hello world", "ab  abab", "h\xC3\xA9 \xF0\x9F\x98\x80"}) {
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, BruteForce(j["model"], kSp + Replace(text, " ", kSp))) << text;
    EXPECT_EQ(*tok->Decode(*ids), text);
  }
}

// Streaming through decoders that treat the first token specially (Strip, Metaspace) and through
// byte-fallback characters: the pieces concatenate to the full decode.
TEST(SentencePieceTest, IncrementalDecodingMatchesFullDecode) {
  for (const Json& j : {Llama2Json(), MetaspaceJson()}) {
    auto tok = LoadJson(j);
    ASSERT_NE(tok, nullptr);
    for (std::string text : {"hello world", "  hello   world  ", "h\xC3\xA9llo \xF0\x9F\x98\x80 world",
                             "</s>hello</s> world"}) {
      for (bool add_special : {false, true}) {
        for (bool skip : {false, true}) {
          auto ids = tok->Encode(text, add_special);
          ASSERT_TRUE(ids.ok());
          IncrementalDecoder dec(*tok, skip);
          std::string streamed;
          for (int32_t id : *ids) streamed += *dec.Push(id);
          streamed += dec.Flush();
          EXPECT_EQ(streamed, *tok->Decode(*ids, skip)) << text << " special " << add_special << " skip " << skip;
        }
      }
    }
  }
}

TEST(SentencePieceTest, UnknownCharactersWithoutByteFallback) {
  const std::string euro = "\xE2\x82\xAC";
  Json fused = Llama2Json(/*byte_fallback=*/false, /*fuse_unk=*/true);
  auto tok = LoadJson(fused);
  ASSERT_NE(tok, nullptr);
  auto id = [&](const std::string& s) { return fused["model"]["vocab"][s].get<int32_t>(); };
  EXPECT_EQ(*tok->Encode("h" + euro + euro + "o"), std::vector<int32_t>({id(kSp + "h"), 0, id("o")}));
  Json unfused = Llama2Json(/*byte_fallback=*/false, /*fuse_unk=*/false);
  auto tok2 = LoadJson(unfused);
  ASSERT_NE(tok2, nullptr);
  EXPECT_EQ(*tok2->Encode("h" + euro + euro + "o"), std::vector<int32_t>({id(kSp + "h"), 0, 0, id("o")}));
  // As Hugging Face decodes them: <unk> is an added special token.
  EXPECT_EQ(*tok2->Decode(*tok2->Encode("h\xC3\xA9")), "h<unk>");
  EXPECT_EQ(*tok2->Decode(*tok2->Encode("h\xC3\xA9"), true), "h");
}

}  // namespace
}  // namespace icecache::tokenizer
