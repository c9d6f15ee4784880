// IncrementalDecoder: streamed pieces are always valid UTF-8 and concatenate to the full decode,
// also when one character's bytes are spread over several tokens.
#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

// Streams ids through an IncrementalDecoder; returns the pieces (Flush's output last).
std::vector<std::string> Stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDecoder dec(t, skip_special);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    auto piece = dec.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status().ToString();
    pieces.push_back(piece.ok() ? *piece : "");
  }
  pieces.push_back(dec.Flush());
  return pieces;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p;
  return s;
}

void CheckStream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special, int* held_back) {
  auto pieces = Stream(t, ids, skip_special);
  for (const auto& p : pieces) EXPECT_TRUE(IsValidUtf8(p)) << p;
  EXPECT_EQ(Join(pieces), *t.Decode(ids, skip_special));
  for (size_t i = 0; i + 1 < pieces.size(); ++i) *held_back += pieces[i].empty();
}

TEST(IncrementalDecoderTest, Qwen3EmojiAndCjk) {
  auto tok = Tokenizer::Load(testing::SourcePath("tests/fixtures/tokenizers/qwen3/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  int held_back = 0;
  for (std::string text : {"Family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok",
                           "\xF0\x9F\xAB\xA0\xF0\x9F\xA6\x84\xF0\x9F\xA7\xAC rare emoji",
                           "\xE9\xBE\x98\xE9\xBD\x89\xE7\x88\xA8 rare CJK \xE4\xB8\xAD\xE6\x96\x87",
                           "<|im_start|>user\nhi \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD<|im_end|>"}) {
    auto ids = t.Encode(text);
    ASSERT_TRUE(ids.ok());
    CheckStream(t, *ids, /*skip_special=*/false, &held_back);
    CheckStream(t, *ids, /*skip_special=*/true, &held_back);
  }
  EXPECT_GT(held_back, 0);  // some character really was split across tokens
}

TEST(IncrementalDecoderTest, ByteTokensHoldBackIncompleteCharacters) {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 256;
  spec.special_tokens = {"<s>"};
  auto dir = testing::TestDir();
  auto tok = Tokenizer::Load(testing::WriteFile(dir / "tokenizer.json", *BuildByteLevelBpeTokenizerJson(spec)));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  // Byte ids equal byte values in this tokenizer: "中" = E4 B8 AD.
  auto pieces = Stream(t, {'a', 0xE4, 0xB8, 0xAD, 'b'}, true);
  EXPECT_EQ(pieces, std::vector<std::string>({"a", "", "", "\xE4\xB8\xAD", "b", ""}));
  // 👍🏽 is two 4-byte characters.
  int held_back = 0;
  std::vector<int32_t> ids = *t.Encode("x\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBDy");
  ids.insert(ids.begin() + 3, 256);  // a special token in the middle of a character's bytes
  CheckStream(t, ids, /*skip_special=*/true, &held_back);
  EXPECT_GE(held_back, 6);
  // A sequence that can never complete is replaced as soon as that is certain.
  pieces = Stream(t, {0xE4, 'A', 0xF0, 0x9F}, true);
  EXPECT_EQ(pieces, std::vector<std::string>({"", "\xEF\xBF\xBD" "A", "", "", "\xEF\xBF\xBD"}));
  EXPECT_EQ(Join(pieces), *t.Decode(std::vector<int32_t>({0xE4, 'A', 0xF0, 0x9F})));
  // Bad ids are reported and do not disturb the stream.
  IncrementalDecoder dec(t);
  EXPECT_EQ(*dec.Push('o'), "o");
  EXPECT_EQ(dec.Push(100000).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*dec.Push('k'), "k");
}

TEST(IncrementalDecoderTest, LongStreamMatchesFullDecode) {
  auto tok = Tokenizer::Load(testing::SourcePath("tests/fixtures/tokenizers/qwen3/tokenizer.json"));
  ASSERT_TRUE(tok.ok());
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Line " + std::to_string(i) + ": caf\xC3\xA9 \xE4\xB8\xAD\xF0\x9F\x98\x80\n";
  auto ids = (*tok)->Encode(text);
  ASSERT_TRUE(ids.ok());
  auto pieces = Stream(**tok, *ids, true);
  EXPECT_EQ(Join(pieces), text);
}

}  // namespace
}  // namespace icecache::tokenizer
