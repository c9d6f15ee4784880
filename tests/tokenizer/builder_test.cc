// BuildByteLevelBpeTokenizerJson: the written tokenizer.json loads back and encodes like a naive
// BPE over its own merges.
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

const char kCorpus[] =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.\n"
    "In the beginning the model reads the text, and then the model writes the text again.\n"
    "Numbers like 12345 and 2026 appear too, as do symbols: (a+b)*c == d!\n";

// Textbook BPE: merge the lowest-ranked adjacent pair (leftmost first) until none applies.
std::vector<int32_t> NaiveBpe(const std::string& word_bytes, const nlohmann::json& model) {
  std::map<std::string, int32_t> vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) vocab[it.key()] = it.value();
  std::string word = BytesToByteLevel(word_bytes);
  if (vocab.count(word)) return {vocab[word]};  // ignore_merges
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < model["merges"].size(); ++r) {
    auto key = std::make_pair(model["merges"][r][0].get<std::string>(), model["merges"][r][1].get<std::string>());
    rank.emplace(key, r);
  }
  std::vector<std::string> syms;
  for (char c : word_bytes) syms.push_back(ByteLevelChar(static_cast<uint8_t>(c)));
  while (true) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = rank.find({syms[i], syms[i + 1]});
      if (it != rank.end() && it->second < best) {
        best = it->second;
        at = i;
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

TEST(BuilderTest, RoundTripsThroughLoad) {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 320;
  spec.corpus = kCorpus;
  auto text = BuildByteLevelBpeTokenizerJson(spec);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto json = nlohmann::json::parse(*text);
  EXPECT_EQ(json["model"]["vocab"].size(), 320u);
  EXPECT_EQ(json["model"]["merges"].size(), 320u - 256u);
  EXPECT_EQ(json["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");

  auto dir = testing::TestDir();
  testing::WriteFile(dir / "tokenizer.json", *text);
  auto tok = Tokenizer::Load(dir.string());  // a directory holding tokenizer.json
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 322);
  EXPECT_EQ((*tok)->TokenToId("<|begin_of_text|>"), 320);
  EXPECT_EQ((*tok)->TokenToId("<|end_of_text|>"), 321);
  EXPECT_TRUE((*tok)->IsSpecial(320));
  EXPECT_EQ((*tok)->bos_id(), 320);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>({321}));

  for (std::string s : {std::string("The quick brown fox"), std::string(kCorpus),
                        std::string("unseen wörds, 中文, emoji 👍🏽 and\ttabs\r\n"), std::string("")}) {
    auto ids = (*tok)->Encode(s);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*(*tok)->Decode(*ids), s);
    auto with_bos = (*tok)->Encode(s, /*add_special_tokens=*/true);
    ASSERT_TRUE(with_bos.ok());
    ASSERT_EQ(with_bos->size(), ids->size() + 1);
    EXPECT_EQ((*with_bos)[0], 320);
  }
  // Frequent words compress; each piece encodes as a naive BPE over the same merges would.
  auto the = (*tok)->Encode(" the");
  EXPECT_EQ(the->size(), 1u);
  for (std::string w : {"The", " quick", " model", " text", " beginning", " zebra", "12", " (", "!\n"}) {
    auto ids = (*tok)->Encode(w);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, NaiveBpe(w, json["model"])) << w;
  }
  // Special tokens in text are matched.
  auto ids = (*tok)->Encode("<|begin_of_text|>The");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], 320);
  EXPECT_EQ(ids->size(), 1 + (*tok)->Encode("The")->size());
}

// A tokenizer.json the builder wrote, with ids from Hugging Face tokenizers
// (tests/fixtures/tokenizers/llama3_style_hf/generate.py): the Llama-3 regex (\p{N}{1,3}),
// ignore_merges and the bos template.
TEST(BuilderTest, Llama3StyleFileMatchesHuggingFace) {
  auto tok = Tokenizer::Load(testing::SourcePath("tests/fixtures/tokenizers/llama3_style_hf/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::istringstream in(testing::ReadFile(testing::SourcePath("tests/fixtures/tokenizers/llama3_style_hf/reference.jsonl")));
  std::string line;
  int lines = 0, mismatches = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    auto expected = j["ids"].get<std::vector<int32_t>>();
    auto ids = (*tok)->Encode(j["text"].get<std::string>(), /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, expected) << j["text"];
    mismatches += *ids != expected;
    ++lines;
  }
  EXPECT_EQ(lines, 308);
  EXPECT_EQ(mismatches, 0);
}

// Added-token flags (lstrip, rstrip, single_word, normalized) against Hugging Face tokenizers
// (tests/fixtures/tokenizers/added_tokens_hf/generate.py).
TEST(BuilderTest, AddedTokenFlagsMatchHuggingFace) {
  auto tok = Tokenizer::Load(testing::SourcePath("tests/fixtures/tokenizers/added_tokens_hf/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::istringstream in(testing::ReadFile(testing::SourcePath("tests/fixtures/tokenizers/added_tokens_hf/reference.jsonl")));
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    auto ids = (*tok)->Encode(j["text"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, j["ids"].get<std::vector<int32_t>>()) << j["text"];
    ++lines;
  }
  EXPECT_EQ(lines, 27);
}

TEST(BuilderTest, FillsVocabularyBeyondCorpusAndIsDeterministic) {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 600;
  spec.corpus = "ab ab ab";
  spec.special_tokens = {"<s>", "</s>", "<pad>"};
  auto a = BuildByteLevelBpeTokenizerJson(spec);
  auto b = BuildByteLevelBpeTokenizerJson(spec);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, *b);
  auto dir = testing::TestDir();
  auto tok = Tokenizer::Load(testing::WriteFile(dir / "tokenizer.json", *a));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 603);
  EXPECT_EQ((*tok)->TokenToId("<pad>"), 602);
  auto ids = (*tok)->Encode(" ab");
  EXPECT_EQ(ids->size(), 1u);
}

TEST(BuilderTest, BytesOnlyAndErrors) {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 256;
  spec.corpus = "";
  auto text = BuildByteLevelBpeTokenizerJson(spec);
  ASSERT_TRUE(text.ok());
  auto dir = testing::TestDir();
  auto tok = Tokenizer::Load(testing::WriteFile(dir / "tokenizer.json", *text));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto ids = (*tok)->Encode("hé");
  EXPECT_EQ(*ids, std::vector<int32_t>({'h', 0xC3, 0xA9}));

  spec.vocab_size = 255;
  EXPECT_EQ(BuildByteLevelBpeTokenizerJson(spec).status().code(), StatusCode::kInvalidArgument);
  spec.vocab_size = 300;
  spec.special_tokens = {"<a>", "<a>"};
  EXPECT_EQ(BuildByteLevelBpeTokenizerJson(spec).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::tokenizer
