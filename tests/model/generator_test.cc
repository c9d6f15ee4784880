#include "model/generator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "model/dense_kv_cache.h"
#include "model/random_checkpoint.h"
#include "tests/model/test_util.h"

#if ICECACHE_HAVE_TOKENIZER
#include "model/tokenizer/tokenizer.h"
#endif

namespace icecache::model {
namespace {

using testing::FixtureDir;

struct GenRun {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::string text;
  FinishReason finish = FinishReason::kNone;
};

GenRun Generate(Model& m, const std::vector<int32_t>& prompt, const SamplingParams& p) {
  DenseKvCache cache(m.attention_shape());
  Generator gen(m, cache);
  GenRun r;
  auto id = gen.Add(prompt, p);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  while (!gen.idle()) {
    std::vector<GenerationEvent> ev;
    EXPECT_TRUE(gen.Step(&ev).ok());
    for (auto& e : ev) {
      r.tokens.push_back(e.token);
      if (e.logprobs) r.logprobs.push_back(*e.logprobs);
      r.text += e.text_delta;
      if (e.finish != FinishReason::kNone) r.finish = e.finish;
    }
  }
  EXPECT_EQ(cache.pages_in_use(), 0);
  return r;
}

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Load(FixtureDir("llama_gqa_f32"));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prompt_ = {5, 17, 230, 41};
};

TEST_F(GeneratorTest, MaxTokens) {
  SamplingParams p;
  p.max_tokens = 7;
  p.ignore_eos = true;
  GenRun r = Generate(*model_, prompt_, p);
  EXPECT_EQ(r.tokens.size(), 7u);
  EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST_F(GeneratorTest, StopIdsAndEos) {
  SamplingParams p;
  p.max_tokens = 10;
  p.ignore_eos = true;
  GenRun full = Generate(*model_, prompt_, p);
  ASSERT_EQ(full.tokens.size(), 10u);
  // Stop on the 4th generated token (if it did not occur earlier).
  const int32_t stop = full.tokens[3];
  size_t first = std::find(full.tokens.begin(), full.tokens.end(), stop) - full.tokens.begin();
  p.stop_ids = {stop};
  GenRun r = Generate(*model_, prompt_, p);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first + 1));
  // eos_token_id from config.json (299 in the fixture) stops unless ignore_eos.
  ASSERT_EQ(model_->config().eos_ids, std::vector<int32_t>{299});
}

TEST_F(GeneratorTest, SeededSamplingIsReproducible) {
  SamplingParams p;
  p.max_tokens = 20;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 77;
  p.ignore_eos = true;
  EXPECT_EQ(Generate(*model_, prompt_, p).tokens, Generate(*model_, prompt_, p).tokens);
}

TEST_F(GeneratorTest, RejectsBadRequests) {
  DenseKvCache cache(model_->attention_shape());
  Generator gen(*model_, cache);
  SamplingParams p;
  EXPECT_EQ(gen.Add({}, p).status().code(), StatusCode::kInvalidArgument);
  auto bad = gen.Add({1, 300}, p);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("300"), std::string::npos);
  p.stop_strings = {"x"};
  EXPECT_NE(gen.Add({1}, p).status().message().find("no tokenizer.json"), std::string::npos);
  std::vector<int32_t> too_long(model_->config().max_position + 1, 1);
  EXPECT_EQ(gen.Add(too_long, {}).status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(gen.idle());
}

TEST_F(GeneratorTest, CancelFreesState) {
  DenseKvCache cache(model_->attention_shape());
  Generator gen(*model_, cache);
  SamplingParams p;
  p.max_tokens = 100;
  auto a = gen.Add(prompt_, p);
  auto b = gen.Add({1, 2}, p);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<GenerationEvent> ev;
  ASSERT_TRUE(gen.Step(&ev).ok());
  EXPECT_EQ(ev.size(), 2u);
  ASSERT_TRUE(gen.Cancel(*a).ok());
  EXPECT_EQ(gen.Cancel(*a).code(), StatusCode::kNotFound);
  EXPECT_EQ(gen.num_sequences(), 1u);
  EXPECT_FALSE(cache.HasSequence(*a));
  ASSERT_TRUE(gen.Cancel(*b).ok());
  EXPECT_EQ(cache.pages_in_use(), 0);
}

TEST_F(GeneratorTest, ContextLimit) {
  std::vector<int32_t> prompt(model_->config().max_position - 2, 7);
  SamplingParams p;
  p.max_tokens = 50;
  p.ignore_eos = true;
  GenRun r = Generate(*model_, prompt, p);
  EXPECT_EQ(r.finish, FinishReason::kContext);
  EXPECT_EQ(r.tokens.size(), 3u);  // positions max-2, max-1 fed; the third token cannot be
}

// A prompt prefilled outside the Generator (as a prefill worker does) and adopted with its first
// token continues exactly like a prompt the Generator prefilled itself.
TEST_F(GeneratorTest, AddPrefilledContinuesLikeAdd) {
  SamplingParams p;
  p.max_tokens = 12;
  p.ignore_eos = true;
  GenRun ref = Generate(*model_, prompt_, p);
  ASSERT_EQ(ref.tokens.size(), 12u);

  DenseKvCache cache(model_->attention_shape());
  ASSERT_TRUE(cache.AddSequence(42).ok());
  std::vector<float> logits;
  SequenceInput in{42, prompt_};
  ASSERT_TRUE(model_->Forward({&in, 1}, cache, LogitsMode::kLastToken, &logits).ok());
  const int32_t first = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  ASSERT_EQ(first, ref.tokens[0]);
  Generator gen(*model_, cache);
  EXPECT_EQ(gen.AddPrefilled(42, {1, 2}, first, p).code(), StatusCode::kFailedPrecondition);  // wrong length
  EXPECT_EQ(gen.AddPrefilled(43, prompt_, first, p).code(), StatusCode::kFailedPrecondition);  // not in backend
  SamplingParams stop_first = p;
  stop_first.stop_ids = {first};
  EXPECT_EQ(gen.AddPrefilled(42, prompt_, first, stop_first).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(gen.AddPrefilled(42, prompt_, first, p).ok());
  EXPECT_EQ(gen.AddPrefilled(42, prompt_, first, p).code(), StatusCode::kAlreadyExists);
  // Add() must not hand out the adopted id.
  auto other = gen.Add({7, 8}, p);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, 42u);
  std::vector<int32_t> got = {first};
  while (!gen.idle()) {
    std::vector<GenerationEvent> ev;
    ASSERT_TRUE(gen.Step(&ev).ok());
    for (auto& e : ev) {
      if (e.id == 42) got.push_back(e.token);
    }
  }
  EXPECT_EQ(got, ref.tokens);
  EXPECT_FALSE(cache.HasSequence(42));
}

#if ICECACHE_HAVE_TOKENIZER
TEST(GeneratorText, StopStringsCutTheText) {
  testing::TempDir dir;
  RandomModelSpec spec;
  spec.vocab = 400;
  spec.seed = 3;
  ASSERT_TRUE(WriteRandomCheckpoint(dir.path(), spec).ok());
  auto m = Model::Load(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_NE((*m)->tokenizer(), nullptr);
  auto prompt = (*m)->tokenizer()->Encode("The quick brown fox");
  ASSERT_TRUE(prompt.ok());
  SamplingParams p;
  p.max_tokens = 40;
  p.temperature = 1.0f;
  p.seed = 5;
  p.ignore_eos = true;
  GenRun full = Generate(**m, *prompt, p);
  ASSERT_EQ(full.finish, FinishReason::kLength);
  ASSERT_GT(full.text.size(), 12u) << full.text;
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  const size_t at = full.text.find(stop);
  p.stop_strings = {stop};
  GenRun r = Generate(**m, *prompt, p);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.text, full.text.substr(0, at));
  EXPECT_LT(r.tokens.size(), full.tokens.size());
}
#endif

// Greedy with frequency and presence penalties and logprobs, against a reference built in the
// test from Model::Forward's host logits: the penalty applied by hand (OpenAI's formula over the
// generated tokens), argmax, and log_softmax of the raw logits in double precision.
TEST_F(GeneratorTest, PenaltiesAndLogprobsMatchAReferenceOverForwardLogits) {
  SamplingParams p;
  p.max_tokens = 24;
  p.ignore_eos = true;
  p.frequency_penalty = 0.7f;
  p.presence_penalty = 0.4f;
  p.logprobs = 5;
  GenRun got = Generate(*model_, prompt_, p);
  ASSERT_EQ(got.tokens.size(), 24u);
  ASSERT_EQ(got.logprobs.size(), 24u);
  SamplingParams plain = p;
  plain.frequency_penalty = plain.presence_penalty = 0.f;
  EXPECT_NE(Generate(*model_, prompt_, plain).tokens, got.tokens);  // the penalties matter here

  const int vocab = model_->config().vocab_size;
  DenseKvCache cache(model_->attention_shape());
  ASSERT_TRUE(cache.AddSequence(1).ok());
  std::vector<int32_t> seq = prompt_;
  std::vector<float> logits;
  SequenceInput in{1, seq};
  ASSERT_TRUE(model_->Forward({&in, 1}, cache, LogitsMode::kLastToken, &logits).ok());
  std::map<int32_t, int> counts;
  for (size_t step = 0; step < 24; ++step) {
    std::vector<double> pen(logits.begin(), logits.end());
    for (auto [id, c] : counts) pen[id] -= 0.7 * c + 0.4;
    const int32_t want = static_cast<int32_t>(std::max_element(pen.begin(), pen.end()) - pen.begin());
    ASSERT_EQ(got.tokens[step], want) << "step " << step;
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (float x : logits) sum += std::exp(x - mx);
    const double lse = mx + std::log(sum);
    // Same forward calls as the generator's; the tolerance covers the fp32 log-sum-exp.
    const TokenLogprobs& lp = got.logprobs[step];
    EXPECT_NEAR(lp.logprob, logits[want] - lse, 1e-4) << "step " << step;
    EXPECT_LE(lp.logprob, 0.f);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    ASSERT_EQ(lp.top_ids.size(), 5u);
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(lp.top_ids[k], order[k]) << "step " << step << " rank " << k;
      EXPECT_NEAR(lp.top_logprobs[k], logits[order[k]] - lse, 1e-4) << "step " << step << " rank " << k;
    }
    ++counts[want];
    seq.push_back(want);
    SequenceInput one{1, std::span<const int32_t>(&seq.back(), 1)};
    ASSERT_TRUE(model_->Forward({&one, 1}, cache, LogitsMode::kLastToken, &logits).ok());
  }
}

TEST_F(GeneratorTest, LargeFrequencyPenaltyNeverRepeatsATokenAndZeroIsNoPenalty) {
  SamplingParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  const GenRun plain = Generate(*model_, prompt_, p);
  // The unpenalised greedy run of this model repeats itself, so the penalised run is a real test.
  ASSERT_LT(std::set<int32_t>(plain.tokens.begin(), plain.tokens.end()).size(), plain.tokens.size());
  SamplingParams zero = p;
  zero.frequency_penalty = 0.f;
  zero.presence_penalty = 0.f;
  EXPECT_EQ(Generate(*model_, prompt_, zero).tokens, plain.tokens);
  SamplingParams big = p;
  big.frequency_penalty = 1e4f;  // beyond any logit gap of this model
  const GenRun pen = Generate(*model_, prompt_, big);
  ASSERT_EQ(pen.tokens.size(), 40u);
  EXPECT_EQ(std::set<int32_t>(pen.tokens.begin(), pen.tokens.end()).size(), pen.tokens.size());
  EXPECT_NE(pen.tokens, plain.tokens);
  SamplingParams presence = p;
  presence.presence_penalty = 1e4f;
  const GenRun pres = Generate(*model_, prompt_, presence);
  EXPECT_EQ(std::set<int32_t>(pres.tokens.begin(), pres.tokens.end()).size(), pres.tokens.size());
}

}  // namespace
}  // namespace icecache::model
