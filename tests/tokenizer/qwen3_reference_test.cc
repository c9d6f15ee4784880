// The Qwen3 tokenizer against ids produced by an independent implementation (transformers.js):
// tests/fixtures/tokenizers/qwen3/reference.jsonl.
#include <chrono>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/normalizer.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

using testing::ReadFile;
using testing::SourcePath;

class Qwen3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto start = std::chrono::steady_clock::now();
    auto t = Tokenizer::Load(SourcePath("tests/fixtures/tokenizers/qwen3/tokenizer.json"));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::printf("Qwen3 tokenizer.json loaded in %.3f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    tok_ = std::move(t).value().release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static Tokenizer* tok_;
};
Tokenizer* Qwen3Test::tok_ = nullptr;

struct Line {
  std::string text;
  std::vector<int32_t> ids;
  bool roundtrip;
};

std::vector<Line> ReadReference() {
  std::vector<Line> lines;
  std::istringstream in(ReadFile(SourcePath("tests/fixtures/tokenizers/qwen3/reference.jsonl")));
  std::string s;
  while (std::getline(in, s)) {
    if (s.empty()) continue;
    auto j = nlohmann::json::parse(s);
    lines.push_back({j["text"].get<std::string>(), j["ids"].get<std::vector<int32_t>>(),
                     j["decoded_roundtrip"].get<bool>()});
  }
  return lines;
}

TEST_F(Qwen3Test, MatchesEveryReferenceLine) {
  auto lines = ReadReference();
  ASSERT_EQ(lines.size(), 156u);
  int mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto ids = tok_->Encode(lines[i].text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, lines[i].ids) << "line " << i + 1 << ": " << lines[i].text;
    mismatches += *ids != lines[i].ids;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Qwen3Test, DecodeInvertsEncodeUpToNfc) {
  for (const Line& line : ReadReference()) {
    auto text = tok_->Decode(line.ids);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, NormalizeNfc(line.text)) << line.text;
    if (line.roundtrip) {
      EXPECT_EQ(*text, line.text);
    }
    auto again = tok_->Encode(line.text);
    ASSERT_TRUE(again.ok());
    auto text2 = tok_->Decode(*again);
    ASSERT_TRUE(text2.ok());
    EXPECT_EQ(*text2, NormalizeNfc(line.text));
  }
}

// Random texts over the character classes the regex and NFC care about, with ids and decoded text
// from Hugging Face tokenizers itself (tests/fixtures/tokenizers/qwen3_hf/generate.py).
TEST_F(Qwen3Test, MatchesHuggingFaceTokenizersOnRandomTexts) {
  std::istringstream in(ReadFile(SourcePath("tests/fixtures/tokenizers/qwen3_hf/random.jsonl")));
  std::string s;
  int lines = 0, mismatches = 0;
  while (std::getline(in, s)) {
    auto j = nlohmann::json::parse(s);
    const std::string text = j["text"].get<std::string>();
    auto expected = j["ids"].get<std::vector<int32_t>>();
    auto ids = tok_->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, expected) << "line " << lines + 1 << ": " << text;
    mismatches += *ids != expected;
    auto decoded = tok_->Decode(expected);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, j["decoded"].get<std::string>()) << text;
    EXPECT_EQ(*decoded, NormalizeNfc(text)) << text;
    ++lines;
  }
  EXPECT_EQ(lines, 400);
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Qwen3Test, SpecialTokensAndConfig) {
  EXPECT_EQ(tok_->vocab_size(), 151669);
  EXPECT_EQ(tok_->TokenToId("<|im_start|>"), 151644);
  EXPECT_TRUE(tok_->IsSpecial(151644));
  EXPECT_FALSE(tok_->IsSpecial(151667));  // <think> is added but not special
  EXPECT_FALSE(tok_->IsSpecial(9707));
  EXPECT_EQ(tok_->bos_id(), std::nullopt);  // bos_token is null in tokenizer_config.json
  auto eos = tok_->eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), 151645), eos.end());
  EXPECT_EQ(tok_->chat_format(), ChatFormat::kChatMl);
  // add_bos_token is false and the post-processor adds nothing.
  auto ids = tok_->Encode("Hello", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<int32_t>({9707}));
  std::vector<int32_t> with_special = {151644, 9707, 151645};
  EXPECT_EQ(*tok_->Decode(with_special), "<|im_start|>Hello<|im_end|>");
  EXPECT_EQ(*tok_->Decode(with_special, /*skip_special_tokens=*/true), "Hello");
  std::vector<int32_t> bad = {151669};
  EXPECT_EQ(tok_->Decode(bad).status().code(), StatusCode::kOutOfRange);
  std::vector<int32_t> negative = {-1};
  EXPECT_EQ(tok_->Decode(negative).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(tok_->Encode("\xFF\xFE").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::tokenizer
