// Unicode tables and NFC, checked against values from Python's unicodedata (Unicode 14.0.0).
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/normalizer.h"
#include "model/tokenizer/unicode.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

TEST(UnicodeTest, PropertiesOfKnownCodePoints) {
  EXPECT_STREQ(UnicodeVersion(), "14.0.0");
  for (char32_t c : {U'A', U'z', U'\u00E9', U'\u00DF', U'\u4E2D', U'\u0905', U'\u02B0', U'\u01C5', U'\u05D0',
                     U'\U00020000'}) {
    EXPECT_TRUE(IsLetter(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'1', U' ', U'_', U'\u0301', U'\U0001F600', U'\u3002', U'\u00BD', U'\u0E3F'}) {
    EXPECT_FALSE(IsLetter(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'0', U'9', U'\u0660', U'\u2165', U'\u00BD', U'\u00B2', U'\U0001D7CE', U'\u3007'}) {
    EXPECT_TRUE(IsNumber(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'a', U'\u4E00', U'.', U'\u0301'}) EXPECT_FALSE(IsNumber(c));
  // White_Space as Oniguruma / Rust regex use it: U+0085 and U+00A0 yes, U+200B / U+FEFF / U+180E no.
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00A0', U'\u1680', U'\u2000',
                     U'\u200A', U'\u2028', U'\u2029', U'\u202F', U'\u205F', U'\u3000'}) {
    EXPECT_TRUE(IsWhiteSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'\u200B', U'\uFEFF', U'\u180E', U'\u001C', U'\u001F', U'a', U'\u00B7'}) {
    EXPECT_FALSE(IsWhiteSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
  EXPECT_EQ(CombiningClass(U'\u0301'), 230);
  EXPECT_EQ(CombiningClass(U'\u0323'), 220);
  EXPECT_EQ(CombiningClass(U'\u0327'), 202);
  EXPECT_EQ(CombiningClass(U'\u05B0'), 10);
  EXPECT_EQ(CombiningClass(U'\u3099'), 8);
  EXPECT_EQ(CombiningClass(U'a'), 0);
  EXPECT_EQ(CombiningClass(U'\u4E2D'), 0);
  EXPECT_EQ(SimpleCaseFold(U'A'), U'a');
  EXPECT_EQ(SimpleCaseFold(U'\u017F'), U's');  // long s
  EXPECT_EQ(SimpleCaseFold(U'\u212A'), U'k');  // Kelvin sign
  EXPECT_EQ(SimpleCaseFold(U'\u03A3'), U'\u03C3');
  EXPECT_EQ(SimpleCaseFold(U'7'), U'7');
}

TEST(UnicodeTest, NfcMatchesPython) {
  // Expected values printed by Python's unicodedata.normalize("NFC", ...): composition, Hangul
  // L+V(+T) and LV+T, singletons (U+212B, U+2126, U+0340), exclusions (U+0958, U+1D15E, U+0F73),
  // canonical reordering of marks, blocked marks, starters that compose (U+0B47 U+0B3E).
  const std::pair<std::string, std::string> cases[] = {
      {"e\xCC\x81", "\xC3\xA9"},
      {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"},
      {"\xE1\x84\x80\xE1\x85\xA1", "\xEA\xB0\x80"},
      {"\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81"},
      {"\xE2\x84\xAB", "\xC3\x85"},
      {"\xE2\x84\xA6", "\xCE\xA9"},
      {"\xCD\x80", "\xCC\x80"},
      {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},
      {"a\xCC\x81\xCC\xA3", "\xE1\xBA\xA1\xCC\x81"},
      {"\xCC\x81" "e", "\xCC\x81" "e"},
      {"e\xCC\x81\xCC\x81", "\xC3\xA9\xCC\x81"},
      {"A\xCC\x8A", "\xC3\x85"},
      {"\xE1\xBA\x9B\xCC\xA3", "\xE1\xBA\x9B\xCC\xA3"},
      {"\xE0\xB3\x86\xE0\xB3\x82\xE0\xB3\x95", "\xE0\xB3\x8B"},
      {"\xE0\xAD\x87\xE0\xAC\xBE", "\xE0\xAD\x8B"},
      {"Ka\xCC\x88se \xEF\xAC\x81 \xC3\x85ngstr\xC3\xB6m", "K\xC3\xA4se \xEF\xAC\x81 \xC3\x85ngstr\xC3\xB6m"},
      {"\xF0\x9D\x85\x9E", "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5"},
      {"\xE0\xBD\xB3", "\xE0\xBD\xB1\xE0\xBD\xB2"},
      {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8\xE1\x86\xA8", "\xEA\xB0\x81\xE1\x86\xA8"},
      {"q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87"},
      {"\xE1\xB8\x8B\xCC\xA3", "\xE1\xB8\x8D\xCC\x87"},
      {"D\xCC\x87\xCC\xA3", "\xE1\xB8\x8C\xCC\x87"},
      {"\xC3\xA9\xCC\x80", "\xC3\xA9\xCC\x80"},
      {"\xD8\xA7\xD9\x93", "\xD8\xA2"},
      {"\xE3\x82\x99\xE3\x81\x8B\xE3\x82\x99", "\xE3\x82\x99\xE3\x81\x8C"},
      {"plain ascii", "plain ascii"},
      {"\xE4\xB8\xAD\xE6\x96\x87", "\xE4\xB8\xAD\xE6\x96\x87"},
  };
  for (const auto& [in, expected] : cases) EXPECT_EQ(NormalizeNfc(in), expected) << in;
}

// 1000 random strings of combining marks, jamo, decomposables and exclusions, with NFC from Python
// (tests/fixtures/tokenizers/nfc_python/generate.py).
TEST(UnicodeTest, NfcMatchesPythonOnRandomStrings) {
  std::istringstream in(testing::ReadFile(testing::SourcePath("tests/fixtures/tokenizers/nfc_python/cases.jsonl")));
  std::string line;
  int lines = 0, mismatches = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    std::string got = NormalizeNfc(j["text"].get<std::string>());
    EXPECT_EQ(got, j["nfc"].get<std::string>()) << j["text"];
    mismatches += got != j["nfc"].get<std::string>();
    ++lines;
  }
  EXPECT_EQ(lines, 1000);
  EXPECT_EQ(mismatches, 0);
}

// Every compatibility character (in groups of 16) and 1000 random strings, with NFKC from Python
// (tests/fixtures/tokenizers/nfkc_python/generate.py).
TEST(UnicodeTest, NfkcMatchesPython) {
  std::istringstream in(testing::ReadFile(testing::SourcePath("tests/fixtures/tokenizers/nfkc_python/cases.jsonl")));
  std::string line;
  int lines = 0, mismatches = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    std::string got = NormalizeNfkc(j["text"].get<std::string>());
    if (got != j["nfkc"].get<std::string>()) {
      ++mismatches;
      ADD_FAILURE() << j["text"] << " -> " << got << " vs " << j["nfkc"];
    }
    ++lines;
  }
  EXPECT_GT(lines, 1200);
  EXPECT_EQ(mismatches, 0);
}

TEST(UnicodeTest, NfcIsIdempotentOnItsOutput) {
  std::string s = "Vie\xCC\xA3\xCC\x82t Nam, \xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB, e\xCC\x81\xCC\xA7";
  std::string once = NormalizeNfc(s);
  EXPECT_NE(once, s);
  EXPECT_EQ(NormalizeNfc(once), once);
}

TEST(UnicodeTest, Utf8Helpers) {
  size_t len;
  EXPECT_EQ(DecodeUtf8("\xE4\xB8\xAD", 0, &len), U'\u4E2D');
  EXPECT_EQ(len, 3u);
  EXPECT_EQ(DecodeUtf8("\xC0\x80", 0, &len), kInvalidCodePoint);  // overlong
  EXPECT_EQ(DecodeUtf8("\xED\xA0\x80", 0, &len), kInvalidCodePoint);  // surrogate
  EXPECT_EQ(DecodeUtf8("\xF4\x90\x80\x80", 0, &len), kInvalidCodePoint);  // > U+10FFFF
  std::string out;
  AppendUtf8(U'\U0001F44D', &out);
  EXPECT_EQ(out, "\xF0\x9F\x91\x8D");

  EXPECT_EQ(StableUtf8PrefixLength("a\xE4\xB8"), 1u);
  EXPECT_EQ(StableUtf8PrefixLength("a\xE4\xB8\xAD"), 4u);
  EXPECT_EQ(StableUtf8PrefixLength("a\xF0\x9F\x91"), 1u);
  EXPECT_EQ(StableUtf8PrefixLength("a\xF0"), 1u);
  EXPECT_EQ(StableUtf8PrefixLength("\xFF"), 1u);        // never valid: final
  EXPECT_EQ(StableUtf8PrefixLength("a\xE0\x80"), 3u);   // E0 80 can never complete
  EXPECT_EQ(StableUtf8PrefixLength("\x80\x80\x80"), 3u);
  EXPECT_EQ(StableUtf8PrefixLength(""), 0u);

  EXPECT_EQ(ToValidUtf8("a\xE4\xB8" "b"), "a\xEF\xBF\xBD" "b");  // one U+FFFD for a truncated sequence
  EXPECT_EQ(ToValidUtf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ToValidUtf8("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
  EXPECT_TRUE(IsValidUtf8("\xE4\xB8\xAD"));
  EXPECT_FALSE(IsValidUtf8("\xE4\xB8"));

  CodePoints cps = DecodeAll("a\xE4\xB8\xAD\xFF");
  EXPECT_EQ(cps.cps, std::vector<char32_t>({U'a', U'\u4E2D', U'\uFFFD'}));
  EXPECT_EQ(cps.offsets, std::vector<uint32_t>({0, 1, 4, 5}));
}

}  // namespace
}  // namespace icecache::tokenizer
