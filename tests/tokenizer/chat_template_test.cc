// Chat formatting against the output of real Jinja2 on the same templates
// (tests/fixtures/tokenizers/chat_expected/expected.json, made by generate.py there).
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::json;

// A small tokenizer.json with every special token the templates use, beside `family`'s config.
std::unique_ptr<Tokenizer> LoadWithConfig(const std::string& family) {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 260;
  spec.special_tokens = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                         "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  auto dir = testing::TestDir() / family;
  std::filesystem::create_directories(dir);
  testing::WriteFile(dir / "tokenizer.json", *BuildByteLevelBpeTokenizerJson(spec));
  if (!family.empty()) {
    std::filesystem::copy_file(testing::SourcePath("tests/fixtures/tokenizers/" + family + "/tokenizer_config.json"),
                               dir / "tokenizer_config.json");
  }
  auto t = Tokenizer::Load((dir / "tokenizer.json").string());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<ChatMessage> Messages(const Json& conv) {
  std::vector<ChatMessage> out;
  for (const auto& m : conv) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(ChatTemplateTest, TwoMessageConversationsLlama3AndChatMl) {
  std::vector<ChatMessage> conv = {{"system", "You are a helpful assistant."},
                                   {"user", "What is the capital of France?"}};
  auto llama3 = LoadWithConfig("llama3_chat");
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(llama3->chat_format(), ChatFormat::kLlama3);
  EXPECT_EQ(*llama3->ApplyChatTemplate(conv, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(llama3->bos_id(), llama3->TokenToId("<|begin_of_text|>"));
  EXPECT_EQ(llama3->eos_ids(), std::vector<int32_t>({*llama3->TokenToId("<|eot_id|>")}));

  auto chatml = LoadWithConfig("chatml_chat");
  ASSERT_NE(chatml, nullptr);
  EXPECT_EQ(chatml->chat_format(), ChatFormat::kChatMl);
  EXPECT_EQ(*chatml->ApplyChatTemplate(conv, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chatml->bos_id(), std::nullopt);
  EXPECT_EQ(chatml->eos_ids(), std::vector<int32_t>({*chatml->TokenToId("<|im_end|>")}));

  // Formatted text encodes its special tokens as single ids.
  auto ids = chatml->Encode(*chatml->ApplyChatTemplate(conv, true));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], *chatml->TokenToId("<|im_start|>"));
}

TEST(ChatTemplateTest, MatchesJinjaOnEveryFixture) {
  Json ref = Json::parse(testing::ReadFile(testing::SourcePath("tests/fixtures/tokenizers/chat_expected/expected.json")));
  int checked = 0;
  for (auto fam = ref["expected"].begin(); fam != ref["expected"].end(); ++fam) {
    auto tok = LoadWithConfig(fam.key());
    ASSERT_NE(tok, nullptr);
    for (auto conv = fam.value().begin(); conv != fam.value().end(); ++conv) {
      auto messages = Messages(ref["conversations"][conv.key()]);
      for (bool gen : {true, false}) {
        auto text = tok->ApplyChatTemplate(messages, gen);
        ASSERT_TRUE(text.ok()) << text.status().ToString();
        EXPECT_EQ(*text, conv.value()[gen ? "true" : "false"].get<std::string>())
            << fam.key() << " / " << conv.key() << " / generation prompt " << gen;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 3 * 2);
}

TEST(ChatTemplateTest, NoTemplateIsFailedPrecondition) {
  auto tok = LoadWithConfig("");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->chat_format(), ChatFormat::kNone);
  EXPECT_EQ(tok->ApplyChatTemplate({{"user", "hi"}}, true).status().code(), StatusCode::kFailedPrecondition);
  // Without a config the template's single prefix token is the bos, and a well-known name the eos.
  EXPECT_EQ(tok->bos_id(), tok->TokenToId("<|begin_of_text|>"));
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>({*tok->TokenToId("<|end_of_text|>")}));
}

}  // namespace
}  // namespace icecache::tokenizer
