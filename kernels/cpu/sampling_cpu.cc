#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace icecache::kernels::cpu {
namespace {
constexpr int kSmallTop = 64;  // TopLogits keeps up to this many by insertion
}  // namespace

Status Argmax(const ArgmaxParams& p) {
  // One row (the sampler's call) is ~10 us of scanning: not worth waking the OpenMP team, and run
  // outside any parallel construct (libgomp reshapes its team even for an `if (false)` region).
  auto row = [&](int r) {
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
  };
  if (p.rows > 1) {
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
    for (int r = 0; r < p.rows; ++r) row(r);
  } else {
    for (int r = 0; r < p.rows; ++r) row(r);
  }
  return Status::Ok();
}

Status TopLogits(const float* logits, int vocab, int count, float* sorted_logits,
                 int32_t* sorted_ids) {
  // Descending by logit, NaN last, ties by ascending id.
  auto before = [logits](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (!xn && x != y) return x > y;
    return a < b;
  };
  if (count <= kSmallTop) {
    // One pass keeping the best `count` in order (insertion): no O(vocab) index array, and most
    // ids are rejected by one comparison with the current last.
    int32_t best[kSmallTop];
    int n = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      if (n == count && !before(i, best[n - 1])) continue;
      int j = n < count ? n++ : n - 1;
      while (j > 0 && before(i, best[j - 1])) {
        best[j] = best[j - 1];
        --j;
      }
      best[j] = i;
    }
    for (int i = 0; i < count; ++i) {
      sorted_ids[i] = best[i];
      sorted_logits[i] = logits[best[i]];
    }
    return Status::Ok();
  }
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
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
  // fp32 exponentials (each within 1 ulp), summed in fp32 blocks of 256 added in double: the
  // result is good to ~1e-6 relative, well inside what logprobs need, at a fraction of the
  // cost of double exponentials.
  double sum = 0;
  for (int b = 0; b < vocab; b += 256) {
    const int e = std::min(vocab, b + 256);
    float part = 0.f;
    for (int i = b; i < e; ++i) {
      const float v = logits[i];
      if (!std::isnan(v)) part += std::exp(v - mx);
    }
    sum += part;
  }
  *host_out = static_cast<float>(mx + std::log(sum));
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu
