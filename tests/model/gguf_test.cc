// GGUF parsing, dequantisation and model loading, against fixtures written and dequantised by
// PyPI's gguf package (tools/gguf/make_gguf_fixtures.py).
#include "model/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model/dense_kv_cache.h"
#include "model/gguf_dequant.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/model_info.h"
#include "model/shard_plan.h"
#include "model/tokenizer/tokenizer.h"
#include "kernels/matmul.h"
#include "tests/model/test_util.h"

namespace icecache::model {
namespace {

const std::string kDir = std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/gguf/";

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST(GgufTest, DequantisesEveryTypeAsTheGgufPackageDoes) {
  auto file = GgufFile::Open(kDir + "dequant.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufContents& c = (*file)->contents();
  std::vector<uint8_t> ref_bytes = ReadAll(kDir + "dequant_reference.f32");
  const std::vector<std::string> names = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"};
  ASSERT_EQ(c.tensors.size(), names.size());
  ASSERT_EQ(ref_bytes.size(), names.size() * 1024 * 4);
  for (size_t i = 0; i < names.size(); ++i) {
    const GgufTensor& t = c.tensors[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{4, 256}));
    std::vector<float> got(1024), want(1024);
    std::memcpy(want.data(), ref_bytes.data() + i * 4096, 4096);
    DequantizeGgml(t.type, (*file)->data(t), 1024, got.data());
    int mismatches = 0;
    for (int k = 0; k < 1024; ++k) mismatches += got[k] != want[k];  // exact: same fp32 operations
    EXPECT_EQ(mismatches, 0) << names[i];
  }
}

// Q4_K kept on the CPU becomes Q4_1 blocks (Q4KToQ4_1): every value within the two fp16 roundings
// (of d * scale and of dmin * min) of the gguf package's Q4_K value; a scale past fp16's range is
// refused so the loader dequantises instead. The loader keeps Q4_K matrices so (fewer bytes).
TEST(GgufTest, Q4KBecomesQ4_1WithinTheFp16RoundingOfItsScales) {
  auto file = GgufFile::Open(kDir + "dequant.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufContents& c = (*file)->contents();
  const GgufTensor* t = nullptr;
  for (const GgufTensor& x : c.tensors) {
    if (x.name == "q4_k") t = &x;
  }
  ASSERT_NE(t, nullptr);
  std::vector<float> want(1024), got(1024);
  DequantizeGgml(t->type, (*file)->data(*t), 1024, want.data());
  std::vector<uint8_t> blocks(1024 / 32 * 20);
  ASSERT_TRUE(Q4KToQ4_1((*file)->data(*t), 1024, blocks.data()));
  kernels::ConvertToF32(kernels::DType::kQ4_1, blocks.data(), got.data(), 1024);
  double worst = 0;
  for (int b = 0; b < 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(want[b * 32 + i]));
    for (int i = 0; i < 32; ++i) {
      const double err = std::fabs(got[b * 32 + i] - want[b * 32 + i]);
      worst = std::max(worst, err / std::max(amax, 1e-30f));
      // |d n - d' n| + |m - m'| <= 2^-11 (15 |d| + |m|) <= 2^-11 * 2 * (|d| 15 + |m|), and each
      // of |d| 15, |m| is at most the block's range plus its largest magnitude.
      // (Below fp16's normal range the roundings are absolute: 2^-25 each, 16 of them at most.)
      ASSERT_LE(err, 4.0 * amax * std::ldexp(1.0, -11) + 16 * std::ldexp(1.0, -25)) << "block " << b << " value " << i;
    }
  }
  std::printf("Q4_K -> Q4_1: largest |difference| / block max = %.3g\n", worst);
  // A scale past fp16's range: refused.
  std::vector<uint8_t> big((*file)->data(*t), (*file)->data(*t) + 144);
  big[0] = 0xff;
  big[1] = 0x7b;  // d = 65504, any scale > 1 overflows
  big[4] = 63;
  EXPECT_FALSE(Q4KToQ4_1(big.data(), 256, blocks.data()));
}

// Q5_0 and Q5_1 (their own fixture, written later with its own random stream) dequantise as the
// gguf package does, bit for bit.
TEST(GgufTest, DequantisesQ5_0AndQ5_1AsTheGgufPackageDoes) {
  auto file = GgufFile::Open(kDir + "dequant_q5.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::vector<uint8_t> ref = ReadAll(kDir + "dequant_q5_reference.f32");
  const GgufContents& c = (*file)->contents();
  ASSERT_EQ(c.tensors.size(), 2u);
  ASSERT_EQ(ref.size(), 2u * 1024 * 4);
  for (size_t i = 0; i < 2; ++i) {
    const GgufTensor& t = c.tensors[i];
    EXPECT_EQ(t.name, i == 0 ? "q5_0" : "q5_1");
    std::vector<float> got(1024), want(1024);
    std::memcpy(want.data(), ref.data() + i * 4096, 4096);
    DequantizeGgml(t.type, (*file)->data(t), 1024, got.data());
    int mismatches = 0;
    for (int k = 0; k < 1024; ++k) mismatches += got[k] != want[k];
    EXPECT_EQ(mismatches, 0) << t.name;
  }
}

// Q5_0 / Q5_1 / Q5_K / Q6_K kept on the CPU become Q8_0 blocks (AsQ8_0Blocks): Q5_0 exactly; the
// others with each block's scale the smallest fp16 at or above max |value| / 127 and every value
// within half that scale of the gguf package's value; a value that is not finite, or a scale past
// fp16's range, is refused so the loader dequantises instead.
TEST(GgufTest, FiveAndSixBitTypesBecomeQ8_0WithinHalfAStep) {
  for (const auto& [fixture, name] : std::vector<std::pair<std::string, std::string>>{
           {"dequant_q5.gguf", "q5_0"}, {"dequant_q5.gguf", "q5_1"}, {"dequant.gguf", "q5_k"}, {"dequant.gguf", "q6_k"}}) {
    auto file = GgufFile::Open(kDir + fixture);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    const GgufTensor* t = nullptr;
    for (const GgufTensor& x : (*file)->contents().tensors) {
      if (x.name == name) t = &x;
    }
    ASSERT_NE(t, nullptr) << name;
    std::vector<float> want(1024), got(1024);
    DequantizeGgml(t->type, (*file)->data(*t), 1024, want.data());
    std::vector<uint8_t> blocks(1024 / 32 * 34);
    ASSERT_TRUE(AsQ8_0Blocks(t->type, (*file)->data(*t), 1024, blocks.data())) << name;
    kernels::ConvertToF32(kernels::DType::kQ8_0, blocks.data(), got.data(), 1024);
    if (t->type == GgmlType::kQ5_0) {
      EXPECT_EQ(got, want) << name;  // exact
      continue;
    }
    double worst = 0;
    for (int b = 0; b < 32; ++b) {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(want[b * 32 + i]));
      const float d = kernels::F16ToF32(static_cast<uint16_t>(blocks[b * 34] | blocks[b * 34 + 1] << 8));
      ASSERT_GE(d, amax / 127.f) << name << " block " << b;
      ASSERT_LE(d, amax / 127.f * (1 + std::ldexp(1.0, -10)) + std::ldexp(1.0, -24)) << name << " block " << b;
      for (int i = 0; i < 32; ++i) {
        const double err = std::fabs(got[b * 32 + i] - want[b * 32 + i]);
        worst = std::max(worst, err / std::max(amax, 1e-30f));
        ASSERT_LE(err, d / 2 * (1 + 1e-6)) << name << " block " << b << " value " << i;
      }
    }
    std::printf("%s -> Q8_0: largest |difference| / block max = %.3g\n", name.c_str(), worst);
    // Not finite, or past fp16's range: refused.
    const int64_t n = GgmlBlockValues(t->type);
    std::vector<uint8_t> bad((*file)->data(*t), (*file)->data(*t) + GgmlBlockBytes(t->type));
    const size_t d_at = t->type == GgmlType::kQ6_K ? 208 : 0;  // the block's fp16 d
    bad[d_at] = 0x00;
    bad[d_at + 1] = 0x7e;  // NaN
    EXPECT_FALSE(AsQ8_0Blocks(t->type, bad.data(), n, blocks.data())) << name;
    if (t->type == GgmlType::kQ5_1) continue;  // its values reach d * 31 + m only
    bad[d_at] = 0xff;
    bad[d_at + 1] = 0x7b;  // 65504: values up to 65504 * 127 * 32 (Q6_K) or * 63 * 31 (Q5_K)
    for (size_t i = 0; i < bad.size(); ++i) {
      if (i != d_at && i != d_at + 1 && (t->type == GgmlType::kQ6_K || i >= 4)) bad[i] = 0x7f;
    }
    EXPECT_FALSE(AsQ8_0Blocks(t->type, bad.data(), n, blocks.data())) << name;
  }
}

TEST(GgufTest, ReadsMetadata) {
  auto file = GgufFile::Open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufContents& c = (*file)->contents();
  EXPECT_EQ(c.version, 3u);
  EXPECT_EQ(*c.GetString("general.architecture"), "llama");
  EXPECT_EQ(*c.GetInt("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(*c.GetFloat("llama.rope.freq_base")), 100000.0f);
  EXPECT_EQ(c.GetStringArray("tokenizer.ggml.tokens")->size(), 300u);
  EXPECT_EQ(c.GetString("llama.block_count").status().code(), StatusCode::kInvalidArgument);
  auto missing = c.GetInt("llama.nothing");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tiny_llama.gguf"), std::string::npos);
}

TEST(GgufTest, ConfigFromMetadata) {
  auto file = GgufFile::Open(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(file.ok());
  auto cfg = GgufModelConfig((*file)->contents());
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, Architecture::kLlama);
  EXPECT_EQ(cfg->hidden_size, 256);
  EXPECT_EQ(cfg->num_layers, 2);
  EXPECT_EQ(cfg->num_heads, 4);
  EXPECT_EQ(cfg->num_kv_heads, 2);
  EXPECT_EQ(cfg->head_dim, 64);
  EXPECT_EQ(cfg->vocab_size, 300);
  EXPECT_EQ(cfg->max_position, 512);
  EXPECT_FALSE(cfg->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(cfg->rope.theta, 100000.0);
  EXPECT_FLOAT_EQ(cfg->rms_norm_eps, 1e-5f);
  EXPECT_EQ(cfg->eos_ids, (std::vector<int32_t>{2}));
}

// The weights of the GGUF, dequantised and un-permuted by icecache, equal those the gguf package
// dequantised and Python un-permuted into tiny_llama_hf/ (bf16 rounded the same way).
TEST(GgufTest, WeightsMatchThePythonConversion) {
  auto gguf = LoadGgufModel(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto hf = Checkpoint::Open(kDir + "tiny_llama_hf");
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ(gguf->checkpoint->TensorNames(), (*hf)->TensorNames());
  for (const std::string& name : (*hf)->TensorNames()) {
    TensorView a = *gguf->checkpoint->Get(name), b = *(*hf)->Get(name);
    EXPECT_EQ(a.info->shape, b.info->shape) << name;
    EXPECT_EQ(a.info->dtype, b.info->dtype) << name;
    ASSERT_EQ(a.info->end - a.info->begin, b.info->end - b.info->begin) << name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.info->end - a.info->begin), 0) << name;
  }
}

// Tensor parallelism: a rank's checkpoint holds, in each quantised weight it slices, exactly the
// full dequantisation's values in its rows (q/k/v, gate/up) or columns (o, down) and zeros
// everywhere else (never dequantised, never written); every other tensor is the full one. On
// tiny_llama (4 q heads, 2 kv heads, intermediate 256, Q4_0..Q8_0 and K-quants): 11 of the 14
// sliced weights are quantised (blk.0 ffn_down is F16, blk.1 attn_q BF16 and blk.1 attn_v F32,
// served whole from the file), and
// the Q4_K/Q5_K/Q6_K o/down weights (blocks of 256) take the whole-row path at 128 columns.
TEST(GgufTest, TensorParallelRankDequantisesOnlyItsSlices) {
  auto full = LoadGgufModel(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const ModelConfig& c = full->config;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    GgufLoadOptions o;
    o.tp_rank = rank;
    o.tp_size = 2;
    auto part = LoadGgufModel(kDir + "tiny_llama.gguf", o);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    auto plan = PlanShard(c, rank, 2);
    ASSERT_TRUE(plan.ok());
    const int64_t d = c.head_dim;
    int sliced = 0;
    for (const std::string& name : full->checkpoint->TensorNames()) {
      TensorView a = *full->checkpoint->Get(name), b = *part->checkpoint->Get(name);
      ASSERT_EQ(a.info->shape, b.info->shape) << name;
      ASSERT_EQ(a.info->dtype, b.info->dtype) << name;
      const size_t bytes = a.info->end - a.info->begin;
      ASSERT_EQ(bytes, b.info->end - b.info->begin) << name;
      if (std::memcmp(a.data, b.data, bytes) == 0) continue;  // served whole
      // Which part this rank reads ([rows, cols] as Model::BindWeights slices them).
      bool columns = false;
      int64_t first = 0, count = 0;
      auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
      if (has("q_proj.weight")) first = plan->q_head0 * d, count = plan->q_heads * d;
      else if (has("k_proj.weight") || has("v_proj.weight")) first = plan->kv_head0 * d, count = plan->kv_heads * d;
      else if (has("o_proj.weight")) columns = true, first = plan->q_head0 * d, count = plan->q_heads * d;
      else if (has("gate_proj.weight") || has("up_proj.weight")) first = plan->inter0, count = plan->inter;
      else if (has("down_proj.weight")) columns = true, first = plan->inter0, count = plan->inter;
      ASSERT_GT(count, 0) << name << " differs but is not a sliced weight";
      ++sliced;
      const int64_t rows = a.info->shape[0], cols = a.info->shape[1];
      const size_t esz = kernels::DTypeSize(a.info->dtype);
      const auto* pa = static_cast<const uint8_t*>(a.data);
      const auto* pb = static_cast<const uint8_t*>(b.data);
      int64_t mismatched = 0, nonzero_outside = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t col = 0; col < cols; ++col) {
          const bool mine = columns ? (col >= first && col < first + count) : (r >= first && r < first + count);
          const size_t at = static_cast<size_t>(r * cols + col) * esz;
          if (mine) {
            mismatched += std::memcmp(pa + at, pb + at, esz) != 0;
          } else {
            for (size_t k = 0; k < esz; ++k) nonzero_outside += pb[at + k] != 0;
          }
        }
      }
      EXPECT_EQ(mismatched, 0) << name;
      EXPECT_EQ(nonzero_outside, 0) << name;
    }
    EXPECT_EQ(sliced, 11);
  }
}

std::vector<float> Logits(Model& m, const std::vector<int32_t>& ids) {
  DenseKvCache cache(m.attention_shape());
  EXPECT_TRUE(cache.AddSequence(1).ok());
  SequenceInput in{1, ids};
  std::vector<float> logits;
  Status s = m.Forward({&in, 1}, cache, LogitsMode::kAllTokens, &logits);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return logits;
}

TEST(GgufTest, ModelLoadsFromFileAndDirectoryWithTheLogitsOfTheConversion) {
  auto from_gguf = Model::Load(kDir + "tiny_llama.gguf", testing::WithGgufWeights(GgufWeights::kBf16));
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().ToString();
  auto from_hf = Model::Load(kDir + "tiny_llama_hf");
  ASSERT_TRUE(from_hf.ok()) << from_hf.status().ToString();
  const std::vector<int32_t> ids = {1, 80, 75, 72, 3, 299, 150, 2, 42};
  std::vector<float> a = Logits(**from_gguf, ids), b = Logits(**from_hf, ids);
  ASSERT_EQ(a.size(), ids.size() * 300);
  ASSERT_EQ(a.size(), b.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(b[i])));
  }
  EXPECT_EQ(max_diff, 0.0) << "max |logit| " << max_abs;  // same weights, same kernels
  EXPECT_GT(max_abs, 0.1);

  ASSERT_NE((*from_gguf)->tokenizer(), nullptr);
  const tokenizer::Tokenizer& tok = *(*from_gguf)->tokenizer();
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.chat_format(), tokenizer::ChatFormat::kChatMl);
  auto text = tok.ApplyChatTemplate({{"user", "hi"}}, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a tiny test model<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto enc = tok.Encode("<|im_start|>the 12 cats");
  ASSERT_TRUE(enc.ok());
  // "the" has no leading space so stays h/e merged as "he" after "t"; digits split one by one.
  std::vector<int32_t> want = {1,
                               *tok.TokenToId("t"),
                               *tok.TokenToId("he"),
                               *tok.TokenToId("\xC4\xA0"),
                               *tok.TokenToId("1"),
                               *tok.TokenToId("2"),
                               *tok.TokenToId("\xC4\xA0"
                                              "c"),
                               *tok.TokenToId("at"),
                               *tok.TokenToId("s")};
  EXPECT_EQ(*enc, want);
  EXPECT_EQ(*tok.Decode(*enc), "<|im_start|>the 12 cats");
  EXPECT_EQ(tok.eos_ids(), (std::vector<int32_t>{2}));

  // A directory without config.json holding one .gguf file loads it; two are refused by name.
  const auto dir = std::filesystem::temp_directory_path() / ("icecache_gguf_dir_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "tiny_llama.gguf", dir / "model.gguf");
  auto from_dir = Model::Load(dir.string(), testing::WithGgufWeights(GgufWeights::kBf16));
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  EXPECT_EQ(Logits(**from_dir, ids), b);
  std::filesystem::copy_file(kDir + "tiny_llama.gguf", dir / "other.gguf");
  auto two = Model::Load(dir.string());
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("several GGUF files"), std::string::npos) << two.status().ToString();
  std::filesystem::remove_all(dir);
}

// The default keeps the file's Q8_0 / Q4_0 / Q4_1 matrices in their blocks (kernels/dtype.h), Q4_K
// as Q4_1 and Q5_K / Q6_K as Q8_0: fewer bytes per decoded token than the bf16 dequantisation, and
// logits within the weights' rounding of it (the kept Q8_0/Q4 weights are the exact values: they
// differ from the bf16 copy by up to 2^-9 relative each; the re-rounded K-quants by up to 1/254 of
// their block's largest), with fp32 and with int16 activations (the default). With int8 activations
// (llama.cpp's numerics) the logits move further, by the stated rounding of x (kernels/matmul.h).
TEST(GgufTest, KeptBlocksGiveTheLogitsOfTheDequantisedWeights) {
  auto bf16 = Model::Load(kDir + "tiny_llama.gguf", testing::WithGgufWeights(GgufWeights::kBf16));
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  auto kept = Model::Load(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  // Q8_0/Q4_0/Q4_1, Q4_K (as Q4_1) and Q5_K/Q6_K (as Q8_0: 273,408 values at 34 / 32 bytes)
  // kept; F16, BF16 and F32 as before: 1,006,272 bytes against 1,797,120 (tiny_llama.gguf's
  // tensors, counted by hand).
  EXPECT_EQ((*kept)->decode_weight_bytes(), 1006272);
  EXPECT_LT((*kept)->decode_weight_bytes(), (*bf16)->decode_weight_bytes());
  double auto_diff = 0, fp32_diff = 0;
  // 9 prompt rows (the GEMV path) and 20 (the GEMM path).
  for (const std::vector<int32_t>& ids :
       {std::vector<int32_t>{1, 80, 75, 72, 3, 299, 150, 2, 42},
        std::vector<int32_t>{1, 5, 9, 33, 71, 250, 8, 8, 13, 99, 100, 101, 7, 64, 3, 2, 17, 18, 19, 20}}) {
    const std::vector<float> want = Logits(**bf16, ids);
    for (auto precision :
         {kernels::MatmulPrecision::kFp32, kernels::MatmulPrecision::kAuto, kernels::MatmulPrecision::kInt8}) {
      testing::ScopedMatmulPrecision scoped(precision);
      const std::vector<float> got = Logits(**kept, ids);
      ASSERT_EQ(got.size(), want.size());
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - want[i])));
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[i])));
      }
      const bool int8 = precision == kernels::MatmulPrecision::kInt8 && ids.size() <= 16;
      // The Q5_K / Q6_K matrices' int8 rounding (up to 1/254 of a block's largest value, against
      // bf16's 2^-9 of each value) moves these logits by 1.1e-2 with fp32 activations.
      EXPECT_LT(max_diff / max_abs, int8 ? 5e-2 : 2e-2) << ids.size() << " rows, " << kernels::MatmulPrecisionName(precision);
      if (precision == kernels::MatmulPrecision::kAuto && ids.size() <= 16) auto_diff = max_diff / max_abs;
      if (precision == kernels::MatmulPrecision::kFp32 && ids.size() <= 16) fp32_diff = max_diff / max_abs;
      EXPECT_GT(max_diff, 0.0);  // not the bf16 weights
      std::printf("tiny_llama.gguf kept blocks, %zu rows, matmul precision %s: max |logit - bf16 weights'| / max |logit| = %.3g\n",
                  ids.size(), std::string(kernels::MatmulPrecisionName(precision)).c_str(), max_diff / max_abs);
    }
  }
  // int16 activations (the default) stay as close as fp32 ones, up to a tenth of the bound.
  EXPECT_LT(auto_diff, fp32_diff + 1e-3);
}

}  // namespace
}  // namespace icecache::model

namespace icecache::model {
namespace {

// A llama (SentencePiece) vocabulary with scores and byte fallback, trained by Google's
// sentencepiece, against sentencepiece's own ids (tools/gguf/make_spm_fixture.py).
TEST(GgufTest, SentencePieceTokenizerMatchesSentencePiece) {
  auto file = GgufFile::Open(kDir + "spm_tokenizer.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tok = GgufTokenizer((*file)->contents());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::ifstream in(kDir + "spm_reference.json", std::ios::binary);
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto& texts = ref["texts"];
  ASSERT_GE(texts.size(), 300u);
  int mismatches = 0, decode_mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto want = ref["ids"][i].get<std::vector<int32_t>>();
    auto ids = (*tok)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    if (*ids != want) {
      ++mismatches;
      ADD_FAILURE() << "text " << i << " '" << text << "': " << ::testing::PrintToString(*ids) << " vs "
                    << ::testing::PrintToString(want);
    }
    auto decoded = (*tok)->Decode(want);
    ASSERT_TRUE(decoded.ok());
    if (*decoded != ref["decoded"][i].get<std::string>()) {
      ++decode_mismatches;
      ADD_FAILURE() << "decode " << i << " '" << *decoded << "' vs '" << ref["decoded"][i].get<std::string>() << "'";
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(decode_mismatches, 0);
  auto with_bos = (*tok)->Encode("hello", /*add_special_tokens=*/true);
  ASSERT_TRUE(with_bos.ok());
  EXPECT_EQ((*with_bos)[0], 1);  // tokenizer.ggml.add_bos_token
}

}  // namespace
}  // namespace icecache::model

namespace icecache::model {
namespace {

// Qwen2 (q/k/v biases) and Qwen3 (q/k norms, head_dim from attention.key_length), stored
// unpermuted: weights byte-equal to the Python conversion and logits equal to it.
class GgufArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufArchTest, LoadsWithTheWeightsAndLogitsOfThePythonConversion) {
  auto from_gguf = Model::Load(kDir + "tiny_" + GetParam() + ".gguf", testing::WithGgufWeights(GgufWeights::kBf16));
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().ToString();
  auto from_hf = Model::Load(kDir + "tiny_" + GetParam() + "_hf");
  ASSERT_TRUE(from_hf.ok()) << from_hf.status().ToString();
  EXPECT_EQ((*from_gguf)->config().arch, (*from_hf)->config().arch);
  EXPECT_EQ((*from_gguf)->config().head_dim, 64);
  EXPECT_EQ((*from_gguf)->config().num_heads, (*from_hf)->config().num_heads);
  EXPECT_EQ((*from_gguf)->config().attention_bias, (*from_hf)->config().attention_bias);
  EXPECT_EQ((*from_gguf)->config().qk_norm, (*from_hf)->config().qk_norm);
  const std::vector<int32_t> ids = {1, 80, 75, 72, 3, 299, 150, 2, 42};
  std::vector<float> a = Logits(**from_gguf, ids), b = Logits(**from_hf, ids);
  ASSERT_EQ(a.size(), ids.size() * 300);
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufArchTest, ::testing::Values("qwen2", "qwen3"));

}  // namespace
}  // namespace icecache::model

namespace icecache::model {
namespace {

TEST(GgufTest, ModelInfoReadsConfigAndTokenizerOfBothLayouts) {
  auto gguf = LoadModelInfo(kDir + "tiny_llama.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto hf = LoadModelInfo(kDir + "tiny_llama_hf");
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ(gguf->gguf_path, kDir + "tiny_llama.gguf");
  EXPECT_TRUE(hf->gguf_path.empty());
  EXPECT_EQ(gguf->config.num_layers, hf->config.num_layers);
  EXPECT_EQ(gguf->config.vocab_size, hf->config.vocab_size);
  ASSERT_NE(gguf->tokenizer, nullptr);
  EXPECT_EQ(hf->tokenizer, nullptr);  // tiny_llama_hf has no tokenizer.json
  EXPECT_EQ(LoadModelInfo(kDir + "missing.gguf").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace icecache::model
