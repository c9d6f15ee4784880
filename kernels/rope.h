// Rotary position embedding, Hugging Face "rotate_half" convention: dimension i pairs with
// i + rotary_dim/2 (not interleaved).
#pragma once

#include <vector>

#include "common/status.h"
#include "kernels/backend.h"

namespace icecache::kernels {

enum class RopeScaling : int { kNone = 0, kLinear = 1, kLlama3 = 2 };

struct RopeConfig {
  int rotary_dim = 128;            // usually head_dim
  double theta = 10000.0;          // rope_theta
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;             // linear and llama3
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  int original_max_position = 8192;  // llama3: original_max_position_embeddings
};

// The rotary_dim/2 inverse frequencies after scaling, as transformers' modeling_rope_utils computes
// them: operation by operation in fp32 (its tensors' dtype), python-float constants rounded to
// fp32. Checked against torch to within 1 ulp (tests/kernels/rope_reference.inc).
std::vector<float> ComputeRopeInvFreq(const RopeConfig& config);

struct RopeParams {
  float* x = nullptr;            // [tokens, heads, head_dim], rotated in place
  const int* positions = nullptr;  // [tokens] absolute positions
  const float* inv_freq = nullptr; // [rotary_dim / 2] from ComputeRopeInvFreq
  int tokens = 0;
  int heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;            // <= head_dim, even; dims beyond it pass through
};

Status ApplyRope(const RopeParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
