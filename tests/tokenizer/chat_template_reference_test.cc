// The published chat templates of tests/fixtures/chat_templates/ rendered by FormatChat (the
// serving path) against Python Jinja2 run as transformers runs it
// (tests/fixtures/chat_templates/reference.json, written by tests/tokenizer/gen_chat_reference.py):
// byte-for-byte equal text, or the same failure (raise_exception with the template's message, or
// another template error).
#include <map>
#include <memory>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::json;

const Json& Reference() {
  static const Json ref =
      Json::parse(testing::ReadFile(testing::SourcePath("tests/fixtures/chat_templates/reference.json")));
  return ref;
}

// 2025-02-03 10:30:00, the generator's FIXED_NOW.
std::tm FixedNow() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 1;
  tm.tm_mday = 3;
  tm.tm_hour = 10;
  tm.tm_min = 30;
  tm.tm_wday = 1;
  tm.tm_yday = 33;
  return tm;
}

std::optional<std::string> OptionalString(const Json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::string>();
}

const ChatTemplate& Compiled(const std::string& name) {
  static std::map<std::string, ChatTemplate>* cache = new std::map<std::string, ChatTemplate>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    const Json& info = Reference()["templates"][name];
    std::string source =
        testing::ReadFile(testing::SourcePath("tests/fixtures/chat_templates/" + info["file"].get<std::string>()));
    it = cache->emplace(name, CompileChatTemplate(source, OptionalString(info["bos_token"]),
                                                  OptionalString(info["eos_token"])))
             .first;
  }
  return it->second;
}

std::vector<ChatMessage> Conversation(const std::string& name) {
  std::vector<ChatMessage> out;
  for (const auto& m : Reference()["conversations"][name]) {
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

TEST(ChatTemplateReferenceTest, EveryTemplateCompiles) {
  for (auto it = Reference()["templates"].begin(); it != Reference()["templates"].end(); ++it) {
    const ChatTemplate& t = Compiled(it.key());
    EXPECT_TRUE(t.compile_status.ok()) << it.key() << ": " << t.compile_status.ToString();
    EXPECT_NE(t.program, nullptr) << it.key();
    EXPECT_NE(t.format, ChatFormat::kNone);
  }
  EXPECT_EQ(Compiled("llama31").format, ChatFormat::kLlama3);
  EXPECT_EQ(Compiled("qwen3").format, ChatFormat::kChatMl);
  EXPECT_EQ(Compiled("mistral_v03").format, ChatFormat::kOther);
  EXPECT_EQ(EndOfTurnTokens(Compiled("phi3_mini")), std::vector<std::string>({"<|end|>"}));
  EXPECT_EQ(EndOfTurnTokens(Compiled("llama31")), std::vector<std::string>({"<|eot_id|>", "<|eom_id|>"}));
}

TEST(ChatTemplateReferenceTest, MatchesJinja2ByteForByte) {
  ChatRenderOptions options;
  options.now = FixedNow();
  int texts = 0, raises = 0, errors = 0;
  std::map<std::string, int> per_template;
  for (const auto& c : Reference()["cases"]) {
    const std::string name = c["template"], conv = c["conversation"];
    const bool gen = c["add_generation_prompt"];
    options.extra_variables_json = c["extra"].dump();
    auto text = FormatChat(Compiled(name), Conversation(conv), gen, options);
    const std::string where = name + " / " + conv + " / generation prompt " + (gen ? "on" : "off") + " / " +
                              options.extra_variables_json;
    if (c.contains("text")) {
      ASSERT_TRUE(text.ok()) << where << ": " << text.status().ToString();
      EXPECT_EQ(*text, c["text"].get<std::string>()) << where;
      ++texts;
      ++per_template[name];
    } else {
      ASSERT_FALSE(text.ok()) << where << " rendered, but Jinja2 failed with: " << c["message"];
      EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << where << ": " << text.status().ToString();
      if (c["error"] == "raise") {
        EXPECT_EQ(text.status().message().rfind("chat template: " + c["message"].get<std::string>() + " (raise_exception at line ", 0), 0u)
            << where << ": " << text.status().message();
        ++raises;
      } else {
        ++errors;
      }
    }
  }
  EXPECT_EQ(per_template.size(), 10u);  // every template renders some conversations
  EXPECT_GE(texts, 190);
  EXPECT_EQ(raises, 8);  // Mistral v0.1 / v0.3 on user-user and assistant-first conversations
  EXPECT_EQ(errors, 12);
}

// Thread safety: one compiled template rendered from four threads gives the reference every time.
TEST(ChatTemplateReferenceTest, ConcurrentRendersAgree) {
  const ChatTemplate& t = Compiled("qwen3");
  const auto conv = Conversation("think");
  std::string expected;
  for (const auto& c : Reference()["cases"]) {
    if (c["template"] == "qwen3" && c["conversation"] == "think" && c["add_generation_prompt"] == true &&
        c["extra"].empty()) {
      expected = c["text"];
    }
  }
  ASSERT_FALSE(expected.empty());
  std::vector<std::thread> threads;
  std::vector<int> good(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i) {
        auto text = FormatChat(t, conv, true);
        good[static_cast<size_t>(k)] += text.ok() && *text == expected;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(good, std::vector<int>(4, 50));
}

// The loader path: a tokenizer_config.json with the Phi-3 template (a family the old code did not
// know) formats chats, and the template's end-of-turn token ends generation.
TEST(ChatTemplateReferenceTest, TokenizerLoadsAnyTemplate) {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 260;
  spec.special_tokens = {"<s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>", "<|system|>"};
  auto dir = testing::TestDir();
  testing::WriteFile(dir / "tokenizer.json", *BuildByteLevelBpeTokenizerJson(spec));
  Json config = {{"bos_token", "<s>"},
                 {"eos_token", "<|endoftext|>"},
                 {"chat_template", testing::ReadFile(testing::SourcePath("tests/fixtures/chat_templates/phi3_mini.jinja"))}};
  testing::WriteFile(dir / "tokenizer_config.json", config.dump());
  auto tok = Tokenizer::Load(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->chat_format(), ChatFormat::kOther);
  auto text = (*tok)->ApplyChatTemplate({{"user", "hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "<|user|>\nhi<|end|>\n<|assistant|>\n");
  auto eos = (*tok)->eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), *(*tok)->TokenToId("<|end|>")), eos.end());
  EXPECT_NE(std::find(eos.begin(), eos.end(), *(*tok)->TokenToId("<|endoftext|>")), eos.end());

  // A template outside the subset still loads; formatting names the construct.
  config["chat_template"] = "{% include 'other.jinja' %}";
  testing::WriteFile(dir / "tokenizer_config.json", config.dump());
  auto bad = Tokenizer::Load(dir.string());
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  auto r = (*bad)->ApplyChatTemplate({{"user", "hi"}}, true);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("include"), std::string::npos) << r.status().message();
}

// Long conversations fit the default work bound: 10,000 messages through every template.
TEST(ChatTemplateReferenceTest, LongConversationsFitTheDefaultBounds) {
  std::vector<ChatMessage> conv;
  for (int i = 0; i < 10000; ++i) conv.push_back({i % 2 == 0 ? "user" : "assistant", "message " + std::to_string(i)});
  conv.push_back({"user", "last"});
  for (auto it = Reference()["templates"].begin(); it != Reference()["templates"].end(); ++it) {
    auto text = FormatChat(Compiled(it.key()), conv, true);
    ASSERT_TRUE(text.ok()) << it.key() << ": " << text.status().ToString();
    EXPECT_NE(text->find("message 9999"), std::string::npos) << it.key();
  }
}

TEST(ChatTemplateReferenceTest, ExtraVariablesAreChecked) {
  const ChatTemplate& t = Compiled("qwen3");
  ChatRenderOptions o;
  o.extra_variables_json = "[1, 2]";
  EXPECT_EQ(FormatChat(t, Conversation("user_only"), true, o).status().code(), StatusCode::kInvalidArgument);
  o.extra_variables_json = "{\"messages\": []}";
  EXPECT_EQ(FormatChat(t, Conversation("user_only"), true, o).status().code(), StatusCode::kInvalidArgument);
  o.extra_variables_json = "{\"enable_thinking\": false}";
  auto text = FormatChat(t, Conversation("user_only"), true, o);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->substr(text->size() - 19), "<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace icecache::tokenizer
