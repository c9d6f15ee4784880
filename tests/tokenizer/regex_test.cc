// The regex engine of the Split pre-tokenizer: the known tokenizer patterns on hand-checked inputs,
// general constructs, and rejection of unsupported syntax.
#include <gtest/gtest.h>

#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

std::vector<std::string> Split(const char* pattern, const std::string& text) {
  auto re = Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  if (!re.ok()) return {};
  CodePoints cps = DecodeAll(text);
  std::vector<std::string> out;
  for (auto [b, e] : re->FindAll(cps.cps)) out.push_back(text.substr(cps.offsets[b], cps.offsets[e] - cps.offsets[b]));
  return out;
}

using V = std::vector<std::string>;

TEST(RegexTest, Qwen2Pattern) {
  const char* p = kQwen2SplitPattern;
  EXPECT_EQ(Split(p, "Hello world"), V({"Hello", " world"}));
  EXPECT_EQ(Split(p, "I'm DON'T it's"), V({"I", "'m", " DON", "'T", " it", "'s"}));
  EXPECT_EQ(Split(p, "a  b"), V({"a", " ", " b"}));
  EXPECT_EQ(Split(p, "x\n\n y"), V({"x", "\n\n", " y"}));
  EXPECT_EQ(Split(p, "end   "), V({"end", "   "}));
  EXPECT_EQ(Split(p, "1234"), V({"1", "2", "3", "4"}));
  EXPECT_EQ(Split(p, "!!!\n\nabc"), V({"!!!\n\n", "abc"}));
  EXPECT_EQ(Split(p, "$x"), V({"$x"}));  // one optional non-letter prefix
  EXPECT_EQ(Split(p, "\xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9"), V({"\xE4\xB8\xAD\xE6\x96\x87", " caf\xC3\xA9"}));
  EXPECT_EQ(Split(p, "a\xC2\xA0" "b"), V({"a", "\xC2\xA0" "b"}));  // U+00A0 is \s but not \p{L}
  EXPECT_EQ(Split(p, "\t\tx"), V({"\t", "\tx"}));
}

TEST(RegexTest, Llama3PatternGroupsDigitsInThrees) {
  EXPECT_EQ(Split(kLlama3SplitPattern, "1234567 89"), V({"123", "456", "7", " ", "89"}));
  EXPECT_EQ(Split(kLlama3SplitPattern, "x=12345;"), V({"x", "=", "123", "45", ";"}));
}

TEST(RegexTest, Gpt2Pattern) {
  EXPECT_EQ(Split(kGpt2SplitPattern, "Hello world 42!"), V({"Hello", " world", " 42", "!"}));
  EXPECT_EQ(Split(kGpt2SplitPattern, "I'M"), V({"I", "'", "M"}));  // case-sensitive there
}

TEST(RegexTest, GeneralConstructs) {
  EXPECT_EQ(Split("a|ab", "ab"), V({"a"}));  // leftmost-first, not longest
  EXPECT_EQ(Split("ab|a", "ab"), V({"ab"}));
  EXPECT_EQ(Split("a+?", "aaa"), V({"a", "a", "a"}));
  EXPECT_EQ(Split("a{2,3}", "aaaaaaa"), V({"aaa", "aaa"}));
  EXPECT_EQ(Split("(ab){2,3}", "abababab ab"), V({"ababab"}));
  EXPECT_EQ(Split("(?:ab)+c", "ababc abc"), V({"ababc", "abc"}));
  EXPECT_EQ(Split("a(?=b)", "ab ac"), V({"a"}));
  EXPECT_EQ(Split("a(?!b)", "ab ac"), V({"a"}));
  EXPECT_EQ(Split("(?i:abc)", "ABC aBc abd"), V({"ABC", "aBc"}));
  EXPECT_EQ(Split("x(?i)yz", "xYZ XYZ"), V({"xYZ"}));
  EXPECT_EQ(Split("[a-c]+", "abcd cab"), V({"abc", "cab"}));
  EXPECT_EQ(Split("[^\\s]+", "one  two"), V({"one", "two"}));
  EXPECT_EQ(Split("\\x41\\u00e9\\x{4E2D}", "A\xC3\xA9\xE4\xB8\xAD"), V({"A\xC3\xA9\xE4\xB8\xAD"}));
  EXPECT_EQ(Split("a.c", "abc a\nc"), V({"abc"}));
  EXPECT_EQ(Split("\\p{N}+|\\P{N}", "ab12"), V({"a", "b", "12"}));
  EXPECT_EQ(Split("\\pL+", "ab12"), V({"ab"}));
  EXPECT_EQ(Split("[\\-\\]x]+", "-]x-y"), V({"-]x-"}));
  EXPECT_EQ(Split("\\s+(?!\\S)", "a   b"), V({"  "}));
  EXPECT_EQ(Split("x*", "aaa"), V({}));  // empty matches are skipped
  // Backtracking into a greedy run.
  EXPECT_EQ(Split("\\s*[\\r\\n]+", "  \n\n  x"), V({"  \n\n"}));
  EXPECT_EQ(Split("a*ab", "aaab"), V({"aaab"}));
  // A long run stays linear enough and does not recurse per character.
  std::string spaces(200000, ' ');
  EXPECT_EQ(Split(kQwen2SplitPattern, spaces + "x"), V({spaces.substr(1), " x"}));
}

TEST(RegexTest, RejectsUnsupportedSyntax) {
  for (const char* p : {"^a", "a$", "\\d", "\\w+", "\\b", "(?<=a)b", "a++", "[[a]]", "(", "a)", "[abc",
                        "\\p{Greek}", "(a*)*", "*a", "a{2", "(?P<n>a)", "\\1", "a**"}) {
    auto re = Regex::Compile(p);
    EXPECT_FALSE(re.ok()) << p;
    if (!re.ok()) {
      EXPECT_EQ(re.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(re.status().message().find("regex"), std::string::npos) << re.status().message();
    }
  }
}

}  // namespace
}  // namespace icecache::tokenizer

namespace icecache::tokenizer {
namespace {

TEST(RegexTest, HostilePatternsFailCleanly) {
  std::string deep(5000, '(');
  deep += "a" + std::string(5000, ')');
  EXPECT_EQ(Regex::Compile(deep).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Regex::Compile("(((ab){1000}){1000}){1000}").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Regex::Compile("(ab){1000}").ok());
}

}  // namespace
}  // namespace icecache::tokenizer
