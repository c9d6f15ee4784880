// The engine on each device: the device-generic forward pass on the CPU device equals the
// reference logits path exactly, and on a CUDA device (when one is present) gives the CPU's
// greedy tokens for 32 steps and its logits within a stated tolerance, on every fixture
// architecture. The CUDA cases skip with a clear message without a device (scripts/gpu-check.sh
// runs them on a GPU machine).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "tests/model/test_util.h"

namespace icecache::model {
namespace {

using testing::FixtureDir;
using testing::ReadFile;

constexpr kernels::Device kCpuDevice{kernels::Backend::kCpu, 0};
constexpr kernels::Device kCudaDevice{kernels::Backend::kCuda, 0};

ModelLoadOptions OnDevice(kernels::Device device) {
  ModelLoadOptions o;
  o.device = device;
  return o;
}

std::vector<std::string> Cases() {
  std::vector<std::string> cases;
  std::istringstream in(ReadFile(FixtureDir("cases.txt")));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) cases.push_back(line);
  }
  return cases;
}

std::vector<int32_t> Prompt(int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < 23; ++i) p.push_back((i * 37 + 11) % vocab);
  return p;
}

struct DeviceRun {
  std::vector<float> prefill_logits;  // [prompt, vocab]
  std::vector<int32_t> tokens;        // greedy, 32 steps
};

DeviceRun RunOn(const std::string& dir, kernels::Device device) {
  DeviceRun r;
  ModelLoadOptions lo;
  lo.device = device;
  auto m = Model::Load(dir, lo);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return r;
  const auto prompt = Prompt((*m)->config().vocab_size);
  {
    DenseKvCacheOptions kv;
    kv.device = device;
    DenseKvCache cache((*m)->attention_shape(), kv);
    EXPECT_TRUE(cache.AddSequence(1).ok());
    SequenceInput in{1, prompt};
    Status st = (*m)->Forward({&in, 1}, cache, LogitsMode::kAllTokens, &r.prefill_logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  DenseKvCacheOptions kv;
  kv.device = device;
  DenseKvCache cache((*m)->attention_shape(), kv);
  Generator gen(**m, cache);
  SamplingParams sp;
  sp.max_tokens = 32;
  sp.ignore_eos = true;
  auto id = gen.Add(prompt, sp);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  while (!gen.idle()) {
    std::vector<GenerationEvent> events;
    Status st = gen.Step(&events);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) break;
    for (const auto& e : events) r.tokens.push_back(e.token);
  }
  return r;
}

// fp32 activations on both sides: the CUDA backend ignores bf16_activations (kernels/matmul.h).
class DeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  testing::ScopedMatmulPrecision fp32_{kernels::MatmulPrecision::kFp32};
};

TEST_P(DeviceTest, CudaMatchesCpu) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device: GPU end-to-end cases skipped";
  const DeviceRun cpu = RunOn(FixtureDir(GetParam()), kCpuDevice);
  const DeviceRun gpu = RunOn(FixtureDir(GetParam()), kCudaDevice);
  ASSERT_EQ(cpu.prefill_logits.size(), gpu.prefill_logits.size());
  // Tolerance: 1e-4 of the largest |logit| (fp32 activations on both; cuBLAS fp32 GEMM without
  // TF32 and warp-order sums against the CPU's FMA order).
  double maxref = 0, maxdiff = 0;
  for (size_t i = 0; i < cpu.prefill_logits.size(); ++i) {
    maxref = std::max(maxref, std::fabs(double(cpu.prefill_logits[i])));
    maxdiff = std::max(maxdiff, std::fabs(double(cpu.prefill_logits[i]) - gpu.prefill_logits[i]));
  }
  EXPECT_LE(maxdiff, 1e-4 * maxref) << GetParam();
  ASSERT_EQ(cpu.tokens.size(), 32u);
  EXPECT_EQ(gpu.tokens, cpu.tokens) << GetParam();
}

// The CPU device through the device-generic path is deterministic and complete (32 tokens); its
// logits are the ones reference_logits_test checks against transformers.
TEST_P(DeviceTest, CpuDeviceRunsTheWholePath) {
  const DeviceRun a = RunOn(FixtureDir(GetParam()), kCpuDevice);
  const DeviceRun b = RunOn(FixtureDir(GetParam()), kernels::Device{kernels::Backend::kAuto, 0});
  ASSERT_EQ(a.tokens.size(), 32u);
  if (!kernels::CudaAvailable()) {
    EXPECT_EQ(a.tokens, b.tokens);  // auto is the CPU here
    EXPECT_EQ(a.prefill_logits, b.prefill_logits);
  }
}

TEST(DeviceTest, MismatchedBackendDeviceIsInvalidArgument) {
  if (!kernels::CudaAvailable()) {
    auto m = Model::Load(FixtureDir("llama_gqa_f32"), OnDevice(kCudaDevice));
    EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition) << m.status().ToString();
    EXPECT_NE(m.status().message().find("CUDA"), std::string::npos) << m.status().message();
    return;
  }
  auto m = Model::Load(FixtureDir("llama_gqa_f32"), OnDevice(kCudaDevice));
  ASSERT_TRUE(m.ok());
  DenseKvCacheOptions kv;
  kv.device = kCpuDevice;
  DenseKvCache cache((*m)->attention_shape(), kv);
  ASSERT_TRUE(cache.AddSequence(1).ok());
  const int32_t tok = 1;
  SequenceInput in{1, {&tok, 1}};
  EXPECT_EQ((*m)->Forward({&in, 1}, cache, LogitsMode::kLastToken).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeviceTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace icecache::model
