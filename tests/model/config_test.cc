#include "model/config.h"

#include <gtest/gtest.h>

namespace icecache::model {
namespace {

constexpr const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
  "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192},
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "tie_word_embeddings": true})";

std::string Patch(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return text.replace(pos, from.size(), to);
}

TEST(ModelConfig, ParsesLlama3) {
  auto c = ParseModelConfig(kLlama);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->rope.scaling, kernels::RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position, 8192);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->bos_ids, std::vector<int32_t>{128000});
  EXPECT_EQ(c->eos_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
}

TEST(ModelConfig, ArchitectureSpecifics) {
  auto q2 = ParseModelConfig(Patch(kLlama, "LlamaForCausalLM", "Qwen2ForCausalLM"));
  ASSERT_TRUE(q2.ok()) << q2.status().ToString();
  EXPECT_TRUE(q2->attention_bias);
  EXPECT_FALSE(q2->qk_norm);
  auto q3 = ParseModelConfig(Patch(Patch(kLlama, "LlamaForCausalLM", "Qwen3ForCausalLM"), "\"vocab_size\"",
                                   "\"head_dim\": 40, \"vocab_size\""));
  ASSERT_TRUE(q3.ok()) << q3.status().ToString();
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_EQ(q3->head_dim, 40);
  EXPECT_EQ(q3->rope.rotary_dim, 40);
  auto lin = ParseModelConfig(Patch(kLlama, R"("rope_type": "llama3")", R"("type": "linear")"));
  ASSERT_TRUE(lin.ok()) << lin.status().ToString();
  EXPECT_EQ(lin->rope.scaling, kernels::RopeScaling::kLinear);
  auto none = ParseModelConfig(Patch(kLlama, R"("rope_scaling": {)", R"("rope_scaling": null, "x": {)"));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->rope.scaling, kernels::RopeScaling::kNone);
  auto mistral = ParseModelConfig(Patch(Patch(kLlama, "LlamaForCausalLM", "MistralForCausalLM"), "\"vocab_size\"",
                                        "\"sliding_window\": null, \"vocab_size\""));
  ASSERT_TRUE(mistral.ok()) << mistral.status().ToString();
}

TEST(ModelConfig, RefusesUnsupportedWithHelpfulErrors) {
  struct Case {
    std::string text;
    std::string needle;
  };
  std::vector<Case> cases = {
      {Patch(kLlama, "LlamaForCausalLM", "GPT2LMHeadModel"), "supported: LlamaForCausalLM"},
      {Patch(Patch(kLlama, "LlamaForCausalLM", "MistralForCausalLM"), "\"vocab_size\"",
             "\"sliding_window\": 128, \"vocab_size\""),
       "sliding-window attention is not supported"},
      {Patch(Patch(kLlama, "LlamaForCausalLM", "Qwen2ForCausalLM"), "\"vocab_size\"",
             "\"use_sliding_window\": true, \"vocab_size\""),
       "sliding-window"},
      {Patch(kLlama, R"("rope_type": "llama3")", R"("rope_type": "yarn")"), "supported: none/default, linear, llama3"},
      {Patch(kLlama, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"), "multiple of num_key_value_heads"},
      {Patch(kLlama, "\"hidden_size\": 64,", ""), "'hidden_size'"},
      {Patch(kLlama, "\"vocab_size\": 300", "\"vocab_size\": -1"), "vocab_size"},
      {Patch(kLlama, "\"vocab_size\": 300", "\"vocab_size\": \"many\""), "vocab_size"},
      {Patch(kLlama, "\"vocab_size\"", "\"hidden_act\": \"gelu\", \"vocab_size\""), "hidden_act"},
      {"{not json", "not valid JSON"},
      {"[1, 2]", "JSON object"},
  };
  for (const Case& c : cases) {
    auto r = ParseModelConfig(c.text, "dir/config.json");
    ASSERT_FALSE(r.ok()) << c.needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(LoadModelConfig("/nonexistent/config.json").status().code(), StatusCode::kNotFound);
}

TEST(ModelConfig, JsonRoundTrip) {
  auto c = ParseModelConfig(kLlama);
  ASSERT_TRUE(c.ok());
  auto back = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->hidden_size, c->hidden_size);
  EXPECT_EQ(back->rope.scaling, c->rope.scaling);
  EXPECT_EQ(back->eos_ids, c->eos_ids);
  EXPECT_EQ(back->tie_word_embeddings, c->tie_word_embeddings);
}

}  // namespace
}  // namespace icecache::model
