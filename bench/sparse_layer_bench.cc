// Workload "sparse-layer" of icecache-bench: the decode cost of ONE attention layer with the
// Llama-3.1-8B head layout (32 query heads, 8 KV heads, head_dim 128, bf16 pages of 16 tokens)
// against context length, IceCache (page selection through the DCI trees + sparse attention over
// the selected pages) next to dense attention over every page, in the same run.
//
// Per context and per --variant (a named DciParams; several variants compare old and new query
// paths in one run on the same keys): one SequenceCache with a single sparse layer is built from
// synthetic keys (kvstore/synthetic_keys.h, one independent stream per KV head); then, per decode step, the step's
// 32 queries (the synthetic queries of each head's GQA group) go through Retriever::Select
// (budget pages: sink + retrieved + window, the GQA group's heads sharing one tree traversal, the
// 8 KV heads spread over a thread pool as the decode worker does) and
// kernels::PagedDecodeAttention; dense = Retriever kFull + the same kernel. Caches are flushed
// (a 64 MiB read, untimed) before every timed call: in a real decode step the other layers'
// weights and pages pass through the caches in between. Times are process CPU time per call
// (all threads) and wall time, medians over the steps. Untimed, per step and query head: the
// share of the exact softmax attention mass (over all n keys) that the selected pages cover, for
// the IceCache selection and for the exact oracle of the same budget (Retriever kOracle).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "common/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/kv_pages.h"
#include "kvstore/page_pool.h"
#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "kvstore/synthetic_keys.h"

namespace icecache::bench {
namespace {

constexpr int kQHeads = 32, kKvHeads = 8, kDim = 128, kPageSize = 16;
constexpr int kCoverageSteps = 5;  // steps whose selections are also scored against exact attention

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Sample {
  std::vector<double> wall, cpu;
};

template <typename F>
void Timed(Sample* s, F&& f) {
  const auto w0 = std::chrono::steady_clock::now();
  const double c0 = ProcessCpuSeconds();
  f();
  s->cpu.push_back(ProcessCpuSeconds() - c0);
  s->wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
}

// A named DciParams: Tuned() (Flat() when the name starts with "flat") with "key=value,..."
// overrides (fov_min, fov_fraction, fov_sqrt, group_fov, centroid, bonus, p1).
struct Variant {
  std::string name;
  kvstore::DciParams dci;
};

bool ParseVariant(const std::string& spec, Variant* v) {
  const size_t colon = spec.find(':');
  v->name = spec.substr(0, colon);
  v->dci = v->name.rfind("flat", 0) == 0 ? kvstore::DciParams::Flat() : kvstore::DciParams::Tuned();
  if (colon == std::string::npos) return !v->name.empty();
  std::stringstream ss(spec.substr(colon + 1));
  for (std::string kv; std::getline(ss, kv, ',');) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = kv.substr(0, eq);
    const double val = std::atof(kv.c_str() + eq + 1);
    if (key == "fov_min") v->dci.fov_min = static_cast<int>(val);
    else if (key == "fov_fraction") v->dci.fov_fraction = val;
    else if (key == "fov_sqrt") v->dci.fov_sqrt = val;
    else if (key == "group_fov") v->dci.group_fov = val;
    else if (key == "centroid") v->dci.centroid_cells = val != 0;
    else if (key == "bonus") v->dci.centroid_bonus = val;
    else if (key == "p1") v->dci.p1 = val;
    else return false;
  }
  return !v->name.empty();
}

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::atoi(item.c_str()));
  return v;
}

int Run(int argc, char** argv) {
  std::vector<int> contexts = {4096, 16384, 32768, 65536};
  int steps = 20, budget = 16, threads = 2;
  bool rest = kvstore::RetrievalPolicy{}.estimate_rest;  // the serving default
  int rest_cells = kvstore::RetrievalPolicy{}.rest_cells;
  kvstore::DciParams dci = kvstore::DciParams::Tuned();
  std::vector<Variant> variants;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--contexts") contexts = ParseInts(next());
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--budget-pages") budget = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--rest-estimate") {
      const std::string v = next();
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "sparse-layer: --rest-estimate takes on or off, got '%s'\n", v.c_str());
        return 2;
      }
      rest = v == "on";
    }
    else if (a == "--rest-cells") rest_cells = std::atoi(next().c_str());
    else if (a == "--fov-min") dci.fov_min = std::atoi(next().c_str());
    else if (a == "--fov-fraction") dci.fov_fraction = std::atof(next().c_str());
    else if (a == "--fov-sqrt") dci.fov_sqrt = std::atof(next().c_str());
    else if (a == "--group-fov") dci.group_fov = std::atof(next().c_str());
    else if (a == "--variant") {
      Variant v;
      if (!ParseVariant(next(), &v)) {
        std::fprintf(stderr,
                     "sparse-layer: bad --variant (NAME[:key=value,...], keys fov_min, fov_fraction, fov_sqrt,"
                     " group_fov, centroid, bonus, p1)\n");
        return 2;
      }
      variants.push_back(v);
    } else if (a == "--json") json = true;
    else {
      std::fprintf(stderr,
                   "usage: icecache-bench sparse-layer [--contexts 4096,16384,32768,65536] [--steps 20]\n"
                   "       [--budget-pages 16] [--threads 2] [--fov-min N] [--fov-fraction F] [--fov-sqrt C]\n"
                   "       [--group-fov G] [--variant NAME[:key=value,...]]... [--rest-estimate on|off] [--rest-cells N] [--json]\n"
                   "  (--rest-estimate: kvstore::RetrievalPolicy::estimate_rest of the IceCache selection, merged into\n"
                   "   its attention by kernels::MergeStates; default: the serving one)\n"
                   "  (trees use DciParams::Tuned(); --fov-*/--group-fov override it; each --variant is Tuned() with\n"
                   "   its own overrides (fov_min, fov_fraction, fov_sqrt, group_fov, centroid 0|1, bonus, p1),\n"
                   "   Flat() for names\n"
                   "   starting with \"flat\"; all variants are measured in this run)\n");
      return 2;
    }
  }
  if (variants.empty()) variants.push_back(Variant{"tuned", dci});
  for (const Variant& var : variants) {
    if (Status s = kvstore::ValidateDciParams(var.dci); !s.ok()) {
      std::fprintf(stderr, "sparse-layer: variant %s: %s\n", var.name.c_str(), s.ToString().c_str());
      return 2;
    }
  }
  if (steps < 1 || budget < 5 || threads < 1 || contexts.empty()) {
    std::fprintf(stderr, "sparse-layer: need steps >= 1, budget >= 5 pages (2 sink + 2 window + 1), threads >= 1\n");
    return 2;
  }
  const int group = kQHeads / kKvHeads;
  ThreadPool pool_threads(static_cast<size_t>(threads));
  std::vector<char> flush(64u << 20, 1);
  volatile long sink = 0;
  auto flush_caches = [&] {
    long acc = 0;
    for (size_t i = 0; i < flush.size(); i += 64) acc += flush[i];
    sink = sink + acc;
  };
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::printf("sparse-layer: one decode step of one layer, %d q / %d kv heads, d %d, bf16 pages of %d, budget %d pages,"
                " %d threads, medians of %d steps (CPU = process CPU time)\n",
                kQHeads, kKvHeads, kDim, kPageSize, budget, threads, steps);
  }
  std::vector<double> sparse_base(variants.size(), 0.0);
  for (int n : contexts) {
    // Keys, values and queries of each KV head from its own synthetic stream.
    std::vector<float> k(static_cast<size_t>(n) * kKvHeads * kDim), v(k.size());
    std::vector<std::vector<float>> queries(kKvHeads);  // [steps * group, dim] per head
    for (int g = 0; g < kKvHeads; ++g) {
      kvstore::SyntheticOptions so;
      so.seed = 1000 + static_cast<uint64_t>(g);
      const auto d = kvstore::MakeSyntheticData(n, kDim, steps * group, so);
      for (int t = 0; t < n; ++t) {
        std::copy_n(&d.keys[static_cast<size_t>(t) * kDim], kDim, &k[(static_cast<size_t>(t) * kKvHeads + g) * kDim]);
        std::copy_n(&d.values[static_cast<size_t>(t) * kDim], kDim, &v[(static_cast<size_t>(t) * kKvHeads + g) * kDim]);
      }
      queries[g] = d.queries;
    }
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const Variant& var = variants[vi];
      kvstore::PagePoolOptions po;
      po.page_size = kPageSize;
      po.head_dim = kDim;
      po.dtype = kernels::DType::kBF16;
      po.num_pages = static_cast<int64_t>(kKvHeads) * (2 * ((n + kPageSize - 1) / kPageSize) + 16);
      auto pool = kvstore::PagePool::Create(po);
      if (!pool.ok()) {
        std::fprintf(stderr, "sparse-layer: %s\n", pool.status().ToString().c_str());
        return 1;
      }
      kvstore::SequenceCacheOptions co;
      co.num_layers = 1;
      co.num_kv_heads = kKvHeads;
      co.dense_layers = 0;
      co.dci = var.dci;
      auto cache = kvstore::SequenceCache::Create(co, pool->get());
      if (!cache.ok()) {
        std::fprintf(stderr, "sparse-layer: %s\n", cache.status().ToString().c_str());
        return 1;
      }
      const float* kp[1] = {k.data()};
      const float* vp[1] = {v.data()};
      const auto b0 = std::chrono::steady_clock::now();
      if (Status s = (*cache)->Build(kp, vp, n, &pool_threads); !s.ok()) {
        std::fprintf(stderr, "sparse-layer: build: %s\n", s.ToString().c_str());
        return 1;
      }
      const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();

      std::vector<float> q(static_cast<size_t>(kQHeads) * kDim), o(q.size()), lse(kQHeads);
      kvstore::RetrievalPolicy sparse_policy{budget, kvstore::RetrievalMode::kSparse};
      sparse_policy.estimate_rest = rest;
      sparse_policy.rest_cells = rest_cells;
      kvstore::Retriever sparse_r(sparse_policy, &pool_threads);
      kvstore::Retriever full_r({budget, kvstore::RetrievalMode::kFull}, &pool_threads);
      kvstore::Retriever oracle_r({budget, kvstore::RetrievalMode::kOracle}, &pool_threads);
      // Attention mass of query head h covered by the pages of `ps` (exact softmax over all keys).
      std::vector<float> probs(n);
      std::vector<uint8_t> covered(n);
      auto coverage = [&](const kvstore::PageSelection& ps, int h) {
        const int g = h / group;
        const float* qh = &q[static_cast<size_t>(h) * kDim];
        float mx = -INFINITY;
        for (int t = 0; t < n; ++t) {
          const float* kt = &k[(static_cast<size_t>(t) * kKvHeads + g) * kDim];
          float dot = 0.f;
          for (int e = 0; e < kDim; ++e) dot += qh[e] * kt[e];
          probs[t] = dot / std::sqrt(static_cast<float>(kDim));
          mx = std::max(mx, probs[t]);
        }
        double total = 0;
        for (int t = 0; t < n; ++t) total += (probs[t] = std::exp(probs[t] - mx));
        std::fill(covered.begin(), covered.end(), 0);
        const kvstore::DciTree* tree = (*cache)->tree(0, g);
        for (int64_t t = 0; t < tree->first_position(); ++t) covered[t] = 1;  // sink pages
        for (int64_t t = tree->end_position(); t < n; ++t) covered[t] = 1;    // window pages
        for (int i = ps.page_indptr[g]; i < ps.page_indptr[g + 1]; ++i) {
          if (ps.tree_leaf[i] < 0) continue;
          for (int64_t pos : tree->LeafPositions(ps.tree_leaf[i])) covered[pos] = 1;
        }
        double got = 0;
        for (int t = 0; t < n; ++t) got += covered[t] ? probs[t] : 0.0;
        return got / total;
      };
      double cover_sparse = 0, cover_oracle = 0;
      int cover_count = 0, scored_groups = 0;
      double tokens_scored = 0, cells_expanded = 0;
      const std::vector<const kvstore::SequenceCache*> seqs = {cache->get()};
      Sample select, sparse_attn, sparse_total, dense;
      int64_t pages_sparse = 0;
      kvstore::PageSelection sel, all;
      if (Status s = full_r.Select(seqs, 0, nullptr, kQHeads, &all); !s.ok()) {
        std::fprintf(stderr, "sparse-layer: %s\n", s.ToString().c_str());
        return 1;
      }
      auto attend = [&](const kvstore::PageSelection& ps) {
        kernels::PagedDecodeAttentionParams a;
        a.q = q.data();
        a.pages = (*pool)->base();
        a.kv_dtype = (*pool)->dtype();
        a.page_indptr = ps.page_indptr.data();
        a.page_ids = ps.page_ids.data();
        a.page_valid = ps.page_valid.data();
        a.out = o.data();
        a.lse = lse.data();
        a.batch = 1;
        a.num_q_heads = kQHeads;
        a.num_kv_heads = kKvHeads;
        a.head_dim = kDim;
        a.page_size = kPageSize;
        a.scale = 1.f / std::sqrt(static_cast<float>(kDim));
        (void)kernels::PagedDecodeAttention(a);
        if (ps.has_rest) {  // the leaves left out, estimated (as the decode backend merges them)
          kernels::MergeStatesParams m;
          m.out = o.data();
          m.lse = lse.data();
          m.out2 = ps.rest_out.data();
          m.lse2 = ps.rest_lse.data();
          m.rows = kQHeads;
          m.head_dim = kDim;
          (void)kernels::MergeStates(m);
        }
      };
      for (int step = 0; step < steps; ++step) {
        for (int g = 0; g < kKvHeads; ++g)
          std::copy_n(&queries[g][static_cast<size_t>(step) * group * kDim], group * kDim, &q[static_cast<size_t>(g) * group * kDim]);
        flush_caches();
        const double c0 = ProcessCpuSeconds();
        const auto w0 = std::chrono::steady_clock::now();
        Timed(&select, [&] { (void)sparse_r.Select(seqs, 0, q.data(), kQHeads, &sel); });
        Timed(&sparse_attn, [&] { attend(sel); });
        sparse_total.cpu.push_back(ProcessCpuSeconds() - c0);
        sparse_total.wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
        pages_sparse = sel.page_indptr.back();
        flush_caches();
        Timed(&dense, [&] { attend(all); });
        if (step < kCoverageSteps) {
          kvstore::PageSelection best;
          if (Status st = oracle_r.Select(seqs, 0, q.data(), kQHeads, &best); !st.ok()) {
            std::fprintf(stderr, "sparse-layer: oracle: %s\n", st.ToString().c_str());
            return 1;
          }
          for (int g = 0; g < kKvHeads; ++g) {  // the work of each group's query (untimed repeat)
            const kvstore::DciTree* tree = (*cache)->tree(0, g);
            std::vector<std::vector<kvstore::ScoredLeaf>> lists;
            kvstore::QueryStats qs;
            tree->QueryGroup(&q[static_cast<size_t>(g) * group * kDim], group, budget, &lists, &qs);
            tokens_scored += static_cast<double>(qs.tokens_scored);
            cells_expanded += static_cast<double>(qs.cells_expanded);
            ++scored_groups;
          }
          for (int h = 0; h < kQHeads; ++h) {
            cover_sparse += coverage(sel, h);
            cover_oracle += coverage(best, h);
            ++cover_count;
          }
        }
      }
      const double st = Median(sparse_total.cpu), dn = Median(dense.cpu);
      if (sparse_base[vi] == 0) sparse_base[vi] = st;
      nlohmann::json row = {{"variant", var.name},
                            {"rest_estimate", rest},
                            {"rest_cells", rest_cells},
                            {"context", n},
                            {"build_s", build_s},
                            {"pages_sparse", pages_sparse},
                            {"pages_dense", all.page_indptr.back()},
                            {"select_cpu_us", Median(select.cpu) * 1e6},
                            {"sparse_attention_cpu_us", Median(sparse_attn.cpu) * 1e6},
                            {"sparse_cpu_us", st * 1e6},
                            {"sparse_wall_us", Median(sparse_total.wall) * 1e6},
                            {"dense_cpu_us", dn * 1e6},
                            {"dense_wall_us", Median(dense.wall) * 1e6},
                            {"dense_over_sparse_cpu", dn / st},
                            {"mass_covered", cover_sparse / cover_count},
                            {"oracle_mass_covered", cover_oracle / cover_count},
                            {"tokens_scored_per_group", tokens_scored / std::max(1, scored_groups)},
                            {"cells_expanded_per_group", cells_expanded / std::max(1, scored_groups)},
                            {"sparse_vs_first_context_cpu", st / sparse_base[vi]}};
      out.push_back(row);
      if (!json) {
        std::printf("  %s context %7d: sparse %7.0f us CPU (select %6.0f + attention %5.0f; %lld pages), dense %8.0f us CPU"
                    " (%.1fx sparse); sparse vs first context %.2fx; attention mass covered %.3f (oracle %.3f);"
                    " %.0f tokens in %.0f cells per group; build %.1f s\n",
                    var.name.c_str(), n, st * 1e6, Median(select.cpu) * 1e6, Median(sparse_attn.cpu) * 1e6,
                    static_cast<long long>(pages_sparse), dn * 1e6, dn / st, st / sparse_base[vi], cover_sparse / cover_count,
                    cover_oracle / cover_count, tokens_scored / std::max(1, scored_groups),
                    cells_expanded / std::max(1, scored_groups), build_s);
      }
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("sparse-layer",
                   "one decode layer (Llama-3.1-8B heads): IceCache selection + sparse attention vs dense, per context",
                   Run);

}  // namespace icecache::bench
