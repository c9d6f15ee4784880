// Two tokenizer.json files written by Hugging Face `tokenizers` from a cut of SmolLM2's
// vocabulary (tools/gguf/make_smollm2_reference.py --small): SmolLM2's own pre-tokenizer
// (Digits(individual_digits) + ByteLevel) and a WhitespaceSplit + Digits + ByteLevel(prefix space)
// variant, each with the ids `tokenizers` gives for 360 varied texts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

using testing::ReadFile;
using testing::SourcePath;

class SmolLm2SmallTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SmolLm2SmallTest, MatchesHuggingFaceTokenizers) {
  const std::string dir = SourcePath("tests/fixtures/tokenizers/" + GetParam());
  auto tok = Tokenizer::Load(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto ref = nlohmann::json::parse(ReadFile(dir + "/expected.json"));
  const auto& texts = ref["texts"];
  ASSERT_GE(texts.size(), 300u);
  int mismatches = 0, decode_mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto want = ref["ids"][i].get<std::vector<int32_t>>();
    auto got = (*tok)->Encode(text);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (*got != want) {
      ++mismatches;
      ADD_FAILURE() << "text " << i << " '" << text << "': " << ::testing::PrintToString(*got) << " vs "
                    << ::testing::PrintToString(want);
    }
    auto decoded = (*tok)->Decode(want);
    ASSERT_TRUE(decoded.ok());
    decode_mismatches += *decoded != ref["decoded"][i].get<std::string>();
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(decode_mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, SmolLm2SmallTest,
                         ::testing::Values("smollm2_small", "smollm2_small_ws", "smollm2_small_nfkc",
                                           "smollm2_small_punct"));

}  // namespace
}  // namespace icecache::tokenizer
