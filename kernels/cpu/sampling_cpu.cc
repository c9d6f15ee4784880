#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace icecache::kernels::cpu {

Status Argmax(const ArgmaxParams& p) {
  // One row (the sampler's call) is ~10 us of scanning: not worth waking the OpenMP team.
  const int threads = p.rows > 1 ? CpuThreads() : 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int r = 0; r < p.rows; ++r) {
    const float* x = p.logits + static_cast<size_t>(r) * p.vocab;
    int best = -1;
    float bv = 0.f;
    for (int i = 0; i < p.vocab; ++i) {
      if (std::isnan(x[i])) continue;
      if (best < 0 || x[i] > bv) {
        best = i;
        bv = x[i];
      }
    }
    p.out[r] = best < 0 ? 0 : best;
  }
  return Status::Ok();
}

Status TopLogits(const float* logits, int vocab, int count, float* sorted_logits,
                 int32_t* sorted_ids) {
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  // Descending by logit, NaN last, ties by ascending id.
  auto before = [logits](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (!xn && x != y) return x > y;
    return a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), before);
  for (int i = 0; i < count; ++i) {
    sorted_ids[i] = ids[i];
    sorted_logits[i] = logits[ids[i]];
  }
  return Status::Ok();
}

Status CountPenalty(const CountPenaltyParams& p) {
  for (int i = 0; i < p.count; ++i) {
    p.logits[p.ids[i]] -= p.frequency * static_cast<float>(p.counts[i]) + p.presence;
  }
  return Status::Ok();
}

Status LogSumExp(const float* logits, int vocab, float* host_out) {
  float mx = -INFINITY;
  for (int i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) mx = std::max(mx, logits[i]);
  }
  if (!std::isfinite(mx)) {  // all -inf / NaN (-inf), or a +inf logit (+inf)
    *host_out = mx;
    return Status::Ok();
  }
  double sum = 0;
  for (int i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - mx);
  }
  *host_out = static_cast<float>(mx + std::log(sum));
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu
