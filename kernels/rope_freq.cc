// ComputeRopeInvFreq mirrors transformers' modeling_rope_utils (_compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_llama3_parameters) operation by operation in
// fp32, the dtype those functions compute in; python-float scalars enter each op rounded to fp32,
// and `scalar / tensor` is torch's reciprocal(tensor) * scalar.
#include <cmath>

#include "kernels/rope.h"

namespace icecache::kernels {

std::vector<float> ComputeRopeInvFreq(const RopeConfig& c) {
  const int dim = c.rotary_dim;
  const int half = dim / 2;
  std::vector<float> inv(half > 0 ? half : 0);
  const float base = static_cast<float>(c.theta);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pw = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[i] = 1.0f / pw;
  }
  if (c.scaling == RopeScaling::kLinear) {
    for (float& f : inv) f = f / static_cast<float>(c.factor);
  } else if (c.scaling == RopeScaling::kLlama3) {
    const double old_ctx = c.original_max_position;
    const double low_wavelen = old_ctx / c.low_freq_factor;
    const double high_wavelen = old_ctx / c.high_freq_factor;
    const float two_pi = static_cast<float>(2 * M_PI);
    const float factor = static_cast<float>(c.factor);
    for (float& f : inv) {
      const float wavelen = (1.0f / f) * two_pi;
      const float scaled = wavelen > static_cast<float>(low_wavelen) ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * static_cast<float>(old_ctx) -
                            static_cast<float>(c.low_freq_factor)) /
                           static_cast<float>(c.high_freq_factor - c.low_freq_factor);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < static_cast<float>(high_wavelen)) &&
                          !(wavelen > static_cast<float>(low_wavelen));
      f = medium ? smoothed : scaled;
    }
  }
  return inv;
}

}  // namespace icecache::kernels
