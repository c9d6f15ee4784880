#include "model/sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/sampling.h"

namespace icecache::model {

Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature)) {
    return InvalidArgumentError("temperature must be a finite number >= 0");
  }
  if (p.top_k < 0) return InvalidArgumentError("top_k must be >= 0 (0 = off)");
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) return InvalidArgumentError("top_p must be in (0, 1]");
  if (!(p.repetition_penalty > 0.f) || !std::isfinite(p.repetition_penalty)) {
    return InvalidArgumentError("repetition_penalty must be a finite number > 0");
  }
  if (p.max_tokens < 1) return InvalidArgumentError("max_tokens must be >= 1");
  for (const std::string& s : p.stop_strings) {
    if (s.empty()) return InvalidArgumentError("stop strings must not be empty");
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed.has_value() ? *params.seed : std::random_device{}()) {}

StatusOr<int32_t> Sampler::Sample(std::span<const float> logits, std::span<const int32_t> context) {
  if (logits.empty()) return InvalidArgumentError("Sample: empty logits");
  const int vocab = static_cast<int>(logits.size());
  const float* row = logits.data();
  if (params_.repetition_penalty != 1.f && !context.empty()) {
    work_.assign(logits.begin(), logits.end());
    const float pen = params_.repetition_penalty;
    std::vector<int32_t> seen(context.begin(), context.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& l = work_[id];
      l = l > 0.f ? l / pen : l * pen;
    }
    row = work_.data();
  }
  if (params_.temperature == 0.f || params_.top_k == 1) {
    int32_t best = 0;
    kernels::ArgmaxParams ap;
    ap.logits = row;
    ap.out = &best;
    ap.rows = 1;
    ap.vocab = vocab;
    ICE_RETURN_IF_ERROR(kernels::Argmax(ap, kernels::Backend::kCpu));
    return best;
  }
  kernels::TopKTopPParams tp;
  tp.logits = row;
  tp.vocab = vocab;
  tp.temperature = params_.temperature;
  tp.top_k = params_.top_k;
  tp.top_p = params_.top_p;
  ICE_ASSIGN_OR_RETURN(kernels::SamplingCandidates cand, kernels::TopKTopPCandidates(tp, kernels::Backend::kCpu));
  if (cand.ids.empty()) return InternalError("Sample: no candidate tokens");
  // Inverse-CDF draw with 53 random bits; the last candidate absorbs rounding.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double acc = 0.0;
  for (size_t i = 0; i < cand.ids.size(); ++i) {
    acc += cand.probs[i];
    if (u < acc) return cand.ids[i];
  }
  return cand.ids.back();
}

}  // namespace icecache::model
