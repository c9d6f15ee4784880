// icecache-bench rest-kernels: the store's multi-head row kernels on --rows rows of --dim (bf16,
// the pool dtype): ScoreRowsMulti (a GQA group's token and cell scoring) and AddWeightedRows (the
// rest estimate's weighted value sum), each for --heads heads at once against the baseline of one
// head at a time (ScoreRows per head; AddWeightedRows with one head per call), in the same
// process. Rows stay in cache (the kernels' own speed; a serving step also waits on memory).
// Reports the minimum thread-CPU microseconds per call over --reps batches of --iters calls.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "kernels/simd_target.h"
#include "kvstore/vector_ops.h"

namespace icecache::bench {
namespace {

constexpr const char* kUsage =
    "usage: icecache-bench rest-kernels [--dim D (64)] [--heads H (3)] [--rows N (1600)]\n"
    "                                   [--iters I (2000)] [--reps R (15)] [--json]\n";

// Minimum over reps of the CPU microseconds per call of fn.
double MinUsPerCall(int reps, int iters, const std::function<void()>& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double c0 = ThreadCpuUs();
    for (int i = 0; i < iters; ++i) fn();
    best = std::min(best, (ThreadCpuUs() - c0) / iters);
  }
  return best;
}

int RunRestKernels(int argc, char** argv) {
  int dim = 64, heads = 3, rows = 1600, iters = 2000, reps = 15;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next_int = [&](int* out, int lo) {
      if (i + 1 >= argc) return false;
      *out = std::atoi(argv[++i]);
      return *out >= lo;
    };
    bool ok = true;
    if (f == "--dim") ok = next_int(&dim, 1);
    else if (f == "--heads") ok = next_int(&heads, 1);
    else if (f == "--rows") ok = next_int(&rows, 1);
    else if (f == "--iters") ok = next_int(&iters, 1);
    else if (f == "--reps") ok = next_int(&reps, 1);
    else if (f == "--json") json = true;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "icecache-bench rest-kernels: bad option '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  const kernels::DType dt = kernels::DType::kBF16;
  std::mt19937 rng(1);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(rows) * dim), q(static_cast<size_t>(heads) * dim);
  std::vector<float> w(static_cast<size_t>(heads) * rows), score(static_cast<size_t>(heads) * rows);
  std::vector<float> out(static_cast<size_t>(heads) * dim, 0.f);
  for (float& v : x) v = g(rng);
  for (float& v : q) v = g(rng);
  for (float& v : w) v = std::exp(g(rng)) * 1e-3f;  // positive weights, as exp(x - max)
  std::vector<uint16_t> stored(x.size());
  kvstore::RowFromF32(dt, x.data(), stored.data(), static_cast<int>(x.size()));
  const void* r = stored.data();

  const double score_one = MinUsPerCall(reps, iters, [&] {
    for (int j = 0; j < heads; ++j)
      kvstore::ScoreRows(dt, r, rows, dim, q.data() + static_cast<size_t>(j) * dim, score.data() + static_cast<size_t>(j) * rows);
  });
  const double score_all = MinUsPerCall(reps, iters, [&] { kvstore::ScoreRowsMulti(dt, r, rows, dim, q.data(), heads, score.data()); });
  const double sum_one = MinUsPerCall(reps, iters, [&] {
    for (int j = 0; j < heads; ++j)
      kvstore::AddWeightedRows(dt, r, rows, dim, w.data() + static_cast<size_t>(j) * rows, 1, out.data() + static_cast<size_t>(j) * dim);
  });
  const double sum_all = MinUsPerCall(reps, iters, [&] { kvstore::AddWeightedRows(dt, r, rows, dim, w.data(), heads, out.data()); });
  double check = 0;  // keeps the results live
  for (float v : score) check += v;
  for (float v : out) check += v;

  const std::string target(kernels::SimdTargetName(kernels::ActiveSimdTarget()));
  if (json) {
    nlohmann::json j = {{"workload", "rest-kernels"}, {"simd", target}, {"dim", dim}, {"heads", heads}, {"rows", rows},
                        {"score_one_head_at_a_time_us", score_one}, {"score_multi_us", score_all},
                        {"score_speedup", score_one / score_all}, {"sum_one_head_at_a_time_us", sum_one},
                        {"sum_multi_us", sum_all}, {"sum_speedup", sum_one / sum_all}, {"check", check}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("rest-kernels (SIMD %s), %d bf16 rows of %d, %d heads, min CPU us per call of %d x %d\n", target.c_str(), rows,
              dim, heads, reps, iters);
  std::printf("ScoreRowsMulti   %8.2f  (one head at a time %8.2f: %.2fx)\n", score_all, score_one, score_one / score_all);
  std::printf("AddWeightedRows  %8.2f  (one head at a time %8.2f: %.2fx)\n", sum_all, sum_one, sum_one / sum_all);
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("rest-kernels", "the store's multi-head row kernels (ScoreRowsMulti, AddWeightedRows) against one head at a time",
                   RunRestKernels);

}  // namespace icecache::bench
