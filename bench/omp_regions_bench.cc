// icecache-bench omp-regions: what a one-thread op costs between parallel regions, by how it runs.
// A loop of iterations, each one CpuThreads()-thread region (a small elementwise loop, as a decode
// GEMV's share) followed by a tiny op run either (a) on the caller's thread as a plain loop, or
// (b) inside `#pragma omp parallel for ... if (false)` — the form the kernels used before
// (docs/BENCHMARKS.md, "OpenMP waiting"). Wall microseconds per iteration, (b) / (a) the cost of
// the `if (false)` region; the same OpenMP settings (GOMP_SPINCOUNT, OMP_WAIT_POLICY) for both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/workload.h"
#include "kernels/backend.h"

namespace icecache::bench {
namespace {

constexpr const char* kUsage = "usage: icecache-bench omp-regions [--iters N (20000)] [--reps R (5)] [--json]\n";

// Wall microseconds per iteration, the minimum over reps: region + (if_false ? if(false) region : plain loop).
double UsPerIteration(int reps, int iters, bool if_false, std::vector<float>* a) {
  float* x = a->data();
  const int n = static_cast<int>(a->size());
  const int threads = kernels::CpuThreads();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int i = 0; i < n; ++i) x[i] = x[i] * 0.999f + 1.f;
      const int one = 1;
      if (if_false) {
#pragma omp parallel for schedule(static) num_threads(one) if (one > 1)
        for (int i = 0; i < 256; ++i) x[i] += 1.f;
      } else {
        for (int i = 0; i < 256; ++i) x[i] += 1.f;
      }
    }
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  return best;
}

int RunOmpRegions(int argc, char** argv) {
  int iters = 20000, reps = 5;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    bool ok = true;
    if ((f == "--iters" || f == "--reps") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      ok = v >= 1;
      (f == "--iters" ? iters : reps) = v;
    } else if (f == "--json") {
      json = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "icecache-bench omp-regions: bad option '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  std::vector<float> a(4096, 1.f);
  // Alternated, so that drift of a shared machine falls on both forms.
  double plain = 1e300, if_false = 1e300;
  for (int round = 0; round < 2; ++round) {
    plain = std::min(plain, UsPerIteration(reps, iters, false, &a));
    if_false = std::min(if_false, UsPerIteration(reps, iters, true, &a));
  }
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (json) {
    nlohmann::json j = {{"workload", "omp-regions"}, {"threads", kernels::CpuThreads()}, {"plain_us", plain},
                        {"if_false_us", if_false}, {"ratio", if_false / plain}, {"check", a[7]},
                        {"gomp_spincount", spin ? spin : ""}, {"omp_wait_policy", policy ? policy : ""}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("omp-regions: %d threads, GOMP_SPINCOUNT=%s OMP_WAIT_POLICY=%s; min wall us per iteration (%d x %d, 2 rounds)\n",
              kernels::CpuThreads(), spin ? spin : "(unset)", policy ? policy : "(unset)", reps, iters);
  std::printf("region + tiny op as a plain loop     %8.2f\n", plain);
  std::printf("region + tiny op in an if(false) one %8.2f  (%.2fx)\n", if_false, if_false / plain);
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("omp-regions", "a one-thread op between parallel regions: plain loop against an if(false) OpenMP region",
                   RunOmpRegions);

}  // namespace icecache::bench
