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
  if (!std::isfinite(p.frequency_penalty)) return InvalidArgumentError("frequency_penalty must be a finite number");
  if (!std::isfinite(p.presence_penalty)) return InvalidArgumentError("presence_penalty must be a finite number");
  if (p.logprobs < -1 || p.logprobs > kernels::kMaxTopLogprobs) {
    return InvalidArgumentError("logprobs must be -1 (off) or in [0, " + std::to_string(kernels::kMaxTopLogprobs) +
                                "] top entries");
  }
  if (p.max_tokens < 1) return InvalidArgumentError("max_tokens must be >= 1");
  for (const std::string& s : p.stop_strings) {
    if (s.empty()) return InvalidArgumentError("stop strings must not be empty");
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params, kernels::Device device)
    : params_(params),
      device_(kernels::ResolveDevice(device)),
      rng_(params.seed.has_value() ? *params.seed : std::random_device{}()) {}

StatusOr<int32_t> Sampler::Sample(std::span<const float> logits, std::span<const int32_t> context,
                                  size_t num_generated) {
  ICE_ASSIGN_OR_RETURN(int32_t token, Draw(logits, context, num_generated));
  if (params_.logprobs >= 0) {
    kernels::TokenLogprobsParams lp;
    lp.logits = logits.data();
    lp.vocab = static_cast<int>(logits.size());
    lp.token = token;
    lp.top = std::min(params_.logprobs, lp.vocab);
    ICE_ASSIGN_OR_RETURN(last_logprobs_, kernels::ComputeTokenLogprobs(lp, device_.backend));
  }
  return token;
}

StatusOr<int32_t> Sampler::Draw(std::span<const float> logits, std::span<const int32_t> context,
                                size_t num_generated) {
  if (logits.empty()) return InvalidArgumentError("Sample: empty logits");
  if (num_generated > context.size()) return InvalidArgumentError("Sample: num_generated > context size");
  const kernels::Backend be = device_.backend;
  const int vocab = static_cast<int>(logits.size());
  const float* row = logits.data();
  bool copied = false;  // the penalties run on a copy of the row in work_
  auto copy_row = [&]() -> Status {
    if (copied) return Status::Ok();
    copied = true;
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, vocab * sizeof(float), &work_));
    ICE_RETURN_IF_ERROR(work_.CopyFromDevice(row, vocab * sizeof(float)));
    row = work_.as<float>();
    return Status::Ok();
  };
  if (params_.repetition_penalty != 1.f && !context.empty()) {
    // The penalty runs on a copy of the row, over the distinct context ids.
    seen_.clear();
    for (int32_t id : context) {
      if (id >= 0 && id < vocab) seen_.push_back(id);
    }
    std::sort(seen_.begin(), seen_.end());
    seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
    ICE_RETURN_IF_ERROR(copy_row());
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, std::max<size_t>(1, seen_.size()) * sizeof(int32_t), &ids_));
    ICE_RETURN_IF_ERROR(ids_.CopyFromHost(seen_.data(), seen_.size() * sizeof(int32_t)));
    kernels::RepetitionPenaltyParams rp;
    rp.logits = work_.as<float>();
    rp.ids = ids_.as<int32_t>();
    rp.count = static_cast<int>(seen_.size());
    rp.vocab = vocab;
    rp.penalty = params_.repetition_penalty;
    ICE_RETURN_IF_ERROR(kernels::RepetitionPenalty(rp, be));
  }
  if ((params_.frequency_penalty != 0.f || params_.presence_penalty != 0.f) && num_generated > 0) {
    // Counts of the generated ids, run-length encoded after sorting (on the host: the ids are
    // host data; only the distinct ids and their counts travel).
    seen_.clear();
    for (int32_t id : context.subspan(context.size() - num_generated)) {
      if (id >= 0 && id < vocab) seen_.push_back(id);
    }
    std::sort(seen_.begin(), seen_.end());
    seen_counts_.clear();
    size_t distinct = 0;
    for (size_t i = 0; i < seen_.size(); ++i) {
      if (distinct > 0 && seen_[distinct - 1] == seen_[i]) {
        ++seen_counts_.back();
      } else {
        seen_[distinct++] = seen_[i];
        seen_counts_.push_back(1);
      }
    }
    seen_.resize(distinct);
    if (distinct > 0) {
      ICE_RETURN_IF_ERROR(copy_row());
      // Own buffers: the repetition penalty's kernel may still be reading ids_.
      ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, distinct * sizeof(int32_t), &count_ids_));
      ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, distinct * sizeof(int32_t), &counts_));
      ICE_RETURN_IF_ERROR(count_ids_.CopyFromHost(seen_.data(), distinct * sizeof(int32_t)));
      ICE_RETURN_IF_ERROR(counts_.CopyFromHost(seen_counts_.data(), distinct * sizeof(int32_t)));
      kernels::CountPenaltyParams cp;
      cp.logits = work_.as<float>();
      cp.ids = count_ids_.as<int32_t>();
      cp.counts = counts_.as<int32_t>();
      cp.count = static_cast<int>(distinct);
      cp.vocab = vocab;
      cp.frequency = params_.frequency_penalty;
      cp.presence = params_.presence_penalty;
      ICE_RETURN_IF_ERROR(kernels::CountPenalty(cp, be));
    }
  }
  if (params_.temperature == 0.f || params_.top_k == 1) {
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, sizeof(int32_t), &best_));
    kernels::ArgmaxParams ap;
    ap.logits = row;
    ap.out = best_.as<int32_t>();
    ap.rows = 1;
    ap.vocab = vocab;
    ICE_RETURN_IF_ERROR(kernels::Argmax(ap, be));
    int32_t best = 0;
    ICE_RETURN_IF_ERROR(best_.CopyToHost(&best, sizeof(best)));
    return best;
  }
  kernels::TopKTopPParams tp;
  tp.logits = row;
  tp.vocab = vocab;
  tp.temperature = params_.temperature;
  tp.top_k = params_.top_k;
  tp.top_p = params_.top_p;
  ICE_ASSIGN_OR_RETURN(kernels::SamplingCandidates cand, kernels::TopKTopPCandidates(tp, be));
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
