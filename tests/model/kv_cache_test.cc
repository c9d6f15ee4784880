// The paged KV cache against recomputation from scratch, and batched decode against decoding
// each sequence alone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "tests/model/test_util.h"

namespace icecache::model {
namespace {

using testing::FixtureDir;

double MaxRelDiff(const float* a, const float* b, int n) {
  double m = 0, d = 0;
  for (int i = 0; i < n; ++i) {
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d / m;
}

// Decode against recompute with bf16 activations, relative to the largest logit (measured on
// qwen2_bias_bf16, Zen 4, 2026-12-02: 3.4e-3 on avx512, 0 on avx2; f32 fixtures do not round).
constexpr double kBf16DecodeTol = 1e-2;

int Argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// "fp32 throughout" (test_util.h, ScopedMatmulPrecision); Bf16ActivationsDecodeStaysCloseToRecompute
// is the bf16 counterpart.
class KvCacheTest : public ::testing::TestWithParam<std::string> {
 protected:
  testing::ScopedMatmulPrecision fp32_{kernels::MatmulPrecision::kFp32};
};

// `steps` greedy decode steps through the cache; after each step the logits must come, within
// `tol` of the largest, from a fresh prefill of the whole sequence so far. same_argmax: the
// recompute picks the decode's token too (else the decode follows the recompute's choice, for
// paths that may part at a near-tie). *worst: the largest difference seen.
void DecodeAgainstRecompute(const std::string& fixture, int steps, double tol, bool same_argmax, double* worst) {
  auto model = Model::Load(FixtureDir(fixture));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Model& m = **model;
  const int vocab = m.config().vocab_size;
  DenseKvCacheOptions opt;
  opt.page_size = 16;
  DenseKvCache cache(m.attention_shape(), opt);
  DenseKvCache scratch(m.attention_shape(), opt);
  ASSERT_TRUE(cache.AddSequence(1).ok());
  std::vector<int32_t> seq = {3, 141, 59, 26, 5};
  std::vector<float> logits, ref;
  SequenceInput in{1, seq};
  ASSERT_TRUE(m.Forward({&in, 1}, cache, LogitsMode::kLastToken, &logits).ok());
  *worst = 0;
  for (int step = 0; step < steps; ++step) {
    // Recompute from scratch over seq (the logits the decode step just gave).
    ASSERT_TRUE(scratch.AddSequence(100 + step).ok());
    SequenceInput full{static_cast<SequenceId>(100 + step), seq};
    ASSERT_TRUE(m.Forward({&full, 1}, scratch, LogitsMode::kLastToken, &ref).ok());
    ASSERT_TRUE(scratch.RemoveSequence(100 + step).ok());
    const double diff = MaxRelDiff(logits.data(), ref.data(), vocab);
    *worst = std::max(*worst, diff);
    ASSERT_LT(diff, tol) << "step " << step;
    if (same_argmax) {
      ASSERT_EQ(Argmax(ref.data(), vocab), Argmax(logits.data(), vocab)) << "step " << step;
    }
    seq.push_back(Argmax(ref.data(), vocab));
    SequenceInput one{1, std::span<const int32_t>(&seq.back(), 1)};
    ASSERT_TRUE(m.Forward({&one, 1}, cache, LogitsMode::kLastToken, &logits).ok());
  }
  EXPECT_EQ(*cache.SequenceLength(1), static_cast<int>(seq.size()));
  EXPECT_EQ(scratch.pages_in_use(), 0);
}

// fp32 throughout; only summation order differs between the paged decode and prefill paths.
TEST_P(KvCacheTest, DecodeMatchesRecomputeFor200Steps) {
  double worst = 0;
  DecodeAgainstRecompute(GetParam(), 200, 1e-4, /*same_argmax=*/true, &worst);
}

// With bf16 activations (the default on avx512) decode and a fresh prefill agree to bf16
// accuracy: the two paths sum in different orders, and a last-bit difference can flip an
// activation's rounding. 60 steps; the greedy tokens may part at a near-tie.
TEST_P(KvCacheTest, Bf16ActivationsDecodeStaysCloseToRecompute) {
  testing::ScopedMatmulPrecision bf16(kernels::MatmulPrecision::kBf16);
  double worst = 0;
  DecodeAgainstRecompute(GetParam(), 60, kBf16DecodeTol, /*same_argmax=*/false, &worst);
  std::printf("[ %s ] bf16 activations: decode vs recompute, max relative logit difference %.3g\n",
              GetParam().c_str(), worst);
}

// Eight sequences of different lengths decoded together give the logits each gives alone.
TEST_P(KvCacheTest, BatchedDecodeEqualsDecodingEachAlone) {
  auto model = Model::Load(FixtureDir(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Model& m = **model;
  const int vocab = m.config().vocab_size;
  constexpr int kBatch = 8, kSteps = 24;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts(kBatch);
  for (int b = 0; b < kBatch; ++b) {
    prompts[b].resize(3 + 5 * b);
    for (int32_t& t : prompts[b]) t = static_cast<int32_t>(rng() % vocab);
  }
  // Alone: each sequence in its own cache.
  std::vector<std::vector<int32_t>> alone_tokens(kBatch);
  std::vector<std::vector<std::vector<float>>> alone_logits(kBatch);
  for (int b = 0; b < kBatch; ++b) {
    DenseKvCache cache(m.attention_shape());
    ASSERT_TRUE(cache.AddSequence(0).ok());
    std::vector<float> logits;
    SequenceInput in{0, prompts[b]};
    ASSERT_TRUE(m.Forward({&in, 1}, cache, LogitsMode::kLastToken, &logits).ok());
    for (int s = 0; s < kSteps; ++s) {
      alone_logits[b].push_back(logits);
      alone_tokens[b].push_back(Argmax(logits.data(), vocab));
      SequenceInput one{0, std::span<const int32_t>(&alone_tokens[b].back(), 1)};
      ASSERT_TRUE(m.Forward({&one, 1}, cache, LogitsMode::kLastToken, &logits).ok());
    }
  }
  // Together: one prefill step for all prompts, then batched one-token steps; sequence ids are
  // not in batch order and the cache is shared.
  DenseKvCache cache(m.attention_shape());
  std::vector<SequenceInput> inputs;
  for (int b = 0; b < kBatch; ++b) {
    ASSERT_TRUE(cache.AddSequence(1000 - b).ok());
    inputs.push_back({static_cast<SequenceId>(1000 - b), prompts[b]});
  }
  std::vector<float> logits;
  ASSERT_TRUE(m.Forward(inputs, cache, LogitsMode::kLastToken, &logits).ok());
  std::vector<int32_t> last(kBatch);
  for (int s = 0; s < kSteps; ++s) {
    for (int b = 0; b < kBatch; ++b) {
      // Identical arithmetic per sequence up to summation order in the batched kernels.
      ASSERT_LT(MaxRelDiff(logits.data() + b * vocab, alone_logits[b][s].data(), vocab), 1e-5)
          << "sequence " << b << " step " << s;
      last[b] = Argmax(logits.data() + b * vocab, vocab);
      ASSERT_EQ(last[b], alone_tokens[b][s]);
      inputs[b].tokens = std::span<const int32_t>(&last[b], 1);
    }
    ASSERT_TRUE(m.Forward(inputs, cache, LogitsMode::kLastToken, &logits).ok());
  }
}

// Continuous batching: sequences joining while others decode (mixed prefill + decode steps,
// chunked prompts) produce the tokens they produce alone.
TEST_P(KvCacheTest, ContinuousBatchingMatchesAlone) {
  auto model = Model::Load(FixtureDir(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Model& m = **model;
  SamplingParams greedy;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12}, {42}, {100, 200, 5, 6, 7}};
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    DenseKvCache cache(m.attention_shape());
    Generator gen(m, cache, nullptr, {});
    auto id = gen.Add(p, greedy);
    ASSERT_TRUE(id.ok());
    std::vector<int32_t> out;
    while (!gen.idle()) {
      std::vector<GenerationEvent> ev;
      ASSERT_TRUE(gen.Step(&ev).ok());
      for (auto& e : ev) out.push_back(e.token);
    }
    alone.push_back(out);
  }
  DenseKvCache cache(m.attention_shape());
  GeneratorOptions go;
  go.max_step_tokens = 6;  // forces chunked prefill of the 12-token prompt
  Generator gen(m, cache, nullptr, go);
  std::map<SequenceId, size_t> which;
  std::map<SequenceId, std::vector<int32_t>> got;
  size_t next = 0;
  int steps = 0;
  while (next < prompts.size() || !gen.idle()) {
    if (next < prompts.size() && steps % 3 == 0) {
      auto id = gen.Add(prompts[next], greedy);
      ASSERT_TRUE(id.ok());
      which[*id] = next++;
    }
    std::vector<GenerationEvent> ev;
    ASSERT_TRUE(gen.Step(&ev).ok());
    for (auto& e : ev) got[e.id].push_back(e.token);
    ++steps;
  }
  for (auto& [id, toks] : got) EXPECT_EQ(toks, alone[which[id]]) << "prompt " << which[id];
  EXPECT_EQ(cache.pages_in_use(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, KvCacheTest,
                         ::testing::Values("llama_gqa_f32", "qwen3_qknorm_headdim32_f32", "qwen2_bias_bf16"),
                         [](const auto& info) { return info.param; });

TEST(DenseKvCache, RefusesWhenPoolIsFullAndRecoversAfterFree) {
  AttentionShape shape{2, 4, 2, 8, 0.35f};
  DenseKvCacheOptions opt;
  opt.page_size = 4;
  opt.max_pages = 2 * 2 * 2;  // two pages per (layer, kv head) in all
  DenseKvCache cache(shape, opt);
  ASSERT_TRUE(cache.AddSequence(1).ok());
  ASSERT_TRUE(cache.AddSequence(2).ok());
  StepSegment s1{1, 8};
  ASSERT_TRUE(cache.BeginStep({&s1, 1}).ok());
  cache.EndStep(true);
  StepSegment s2{2, 1};
  Status st = cache.BeginStep({&s2, 1});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_EQ(cache.pages_in_use(), 8);
  ASSERT_TRUE(cache.RemoveSequence(1).ok());
  EXPECT_EQ(cache.pages_in_use(), 0);
  ASSERT_TRUE(cache.BeginStep({&s2, 1}).ok());
  cache.EndStep(false);
  EXPECT_EQ(*cache.SequenceLength(2), 0);
  StepSegment dup[2] = {{2, 1}, {2, 1}};
  EXPECT_EQ(cache.BeginStep(dup).code(), StatusCode::kInvalidArgument);
  StepSegment unknown{9, 1};
  EXPECT_EQ(cache.BeginStep({&unknown, 1}).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.AddSequence(2).code(), StatusCode::kAlreadyExists);
}

// K/V written through Attend come back from ReadKv, across steps and page boundaries, and the
// attention output of a one-token step equals a brute-force softmax over what was stored.
TEST(DenseKvCache, StoresKvAndAttendsExactly) {
  const AttentionShape shape{2, 4, 2, 8, 1.f / std::sqrt(8.f)};
  for (kernels::DType dt : {kernels::DType::kF32, kernels::DType::kBF16}) {
    DenseKvCacheOptions opt;
    opt.page_size = 3;
    opt.kv_dtype = dt;
    DenseKvCache cache(shape, opt);
    ASSERT_TRUE(cache.AddSequence(5).ok());
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> all_k, all_v;  // [pos, kv_head, dim] of layer 1
    std::vector<float> q, k, v, out;
    for (int n : {7, 1, 1, 4, 1}) {
      q.resize(n * 4 * 8);
      k.resize(n * 2 * 8);
      v.resize(n * 2 * 8);
      out.resize(q.size());
      StepSegment seg{5, n};
      ASSERT_TRUE(cache.BeginStep({&seg, 1}).ok());
      for (int layer = 0; layer < 2; ++layer) {
        for (auto* buf : {&q, &k, &v}) {
          for (float& x : *buf) x = nd(rng);
        }
        ASSERT_TRUE(cache.Attend(layer, q.data(), k.data(), v.data(), out.data()).ok());
        if (layer == 1) {
          all_k.insert(all_k.end(), k.begin(), k.end());
          all_v.insert(all_v.end(), v.begin(), v.end());
        }
      }
      cache.EndStep(true);
      if (n != 1) continue;
      // Brute force for the last layer's single query over every stored token.
      const int len = static_cast<int>(all_k.size() / 16);
      for (int h = 0; h < 4; ++h) {
        const int g = h / 2;
        std::vector<double> s(len);
        double mx = -1e30, z = 0;
        for (int t = 0; t < len; ++t) {
          double dot = 0;
          for (int d = 0; d < 8; ++d) dot += q[h * 8 + d] * static_cast<double>(all_k[(t * 2 + g) * 8 + d]);
          s[t] = dot * shape.scale;
          mx = std::max(mx, s[t]);
        }
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int d = 0; d < 8; ++d) {
          double o = 0;
          for (int t = 0; t < len; ++t) o += s[t] / z * all_v[(t * 2 + g) * 8 + d];
          // f32 pages: summation order only (1e-5); bf16 pages round K and V (2^-8 relative).
          EXPECT_NEAR(out[h * 8 + d], o, dt == kernels::DType::kF32 ? 1e-5 : 3e-2) << "len " << len;
        }
      }
    }
    const int len = *cache.SequenceLength(5);
    ASSERT_EQ(len, 14);
    std::vector<float> rk(len * 8), rv(len * 8);
    for (int g = 0; g < 2; ++g) {
      ASSERT_TRUE(cache.ReadKv(5, 1, g, rk.data(), rv.data()).ok());
      for (int t = 0; t < len; ++t) {
        for (int d = 0; d < 8; ++d) {
          const float tol = dt == kernels::DType::kF32 ? 0.f : 1e-2f * std::fabs(all_k[(t * 2 + g) * 8 + d]) + 1e-6f;
          EXPECT_NEAR(rk[t * 8 + d], all_k[(t * 2 + g) * 8 + d], tol);
          EXPECT_NEAR(rv[t * 8 + d], all_v[(t * 2 + g) * 8 + d], dt == kernels::DType::kF32 ? 0.f : 1e-2f * std::fabs(all_v[(t * 2 + g) * 8 + d]) + 1e-6f);
        }
      }
    }
    // All heads of the layer at once, [len, kv heads, head_dim]: the per-head reads interleaved.
    std::vector<float> lk(len * 2 * 8), lv(lk.size());
    ASSERT_TRUE(cache.ReadLayerKv(5, 1, lk.data(), lv.data()).ok());
    for (int g = 0; g < 2; ++g) {
      ASSERT_TRUE(cache.ReadKv(5, 1, g, rk.data(), rv.data()).ok());
      for (int t = 0; t < len; ++t) {
        for (int d = 0; d < 8; ++d) {
          EXPECT_EQ(lk[(t * 2 + g) * 8 + d], rk[t * 8 + d]);
          EXPECT_EQ(lv[(t * 2 + g) * 8 + d], rv[t * 8 + d]);
        }
      }
    }
    EXPECT_EQ(cache.ReadKv(6, 0, 0, rk.data(), rv.data()).code(), StatusCode::kNotFound);
    EXPECT_EQ(cache.ReadKv(5, 2, 0, rk.data(), rv.data()).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace icecache::model
