// icecache-bench retrieval: IceCache page retrieval (DciTree + Retriever) against an exact SIMD
// scan and faiss (HNSW, IVF-Flat) on the same keys. See docs/BENCHMARKS.md.
// Page baselines at the same budget (sink + K pages + window, K = budget - sink - window):
//   oracle      the tree's own best K leaves (Retriever kOracle: ranked by their best token);
//   leaves_by_mass  the tree's K leaves of most attention mass: what the layout allows;
//   contiguous  the exact best K pages of 16 consecutive tokens by attention mass (token order);
//   topic_pages (synthetic keys only) the best K pages of the generator's own topics, each topic's
//               tokens in token order cut into pages: what a clustering that knew every token's
//               topic exactly (a topic-pure layout) could page;
//   quest       Quest (Retriever kQuest on a SparseLayout::kTokenOrder cache of the same keys).
// "mass recall" is the attention mass of the selected tokens over that of the best as many
// tokens; "kept mass" is the selected tokens' share of the whole softmax.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "common/status.h"
#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "kvstore/synthetic_keys.h"
#include "kvstore/vector_ops.h"

#ifdef ICECACHE_HAVE_FAISS
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>
#include <omp.h>
#endif

namespace icecache::bench {
namespace {

using kvstore::DciParams;
using kvstore::PagePool;
using kvstore::PageSelection;
using kvstore::RetrievalMode;
using kvstore::RetrievalPolicy;
using kvstore::Retriever;
using kvstore::SequenceCache;
using Clock = std::chrono::steady_clock;

double Us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

// edge (the sink and window pages' mass) plus the k largest of the pages' masses, largest first.
double KeptWithBestPages(double edge, std::vector<double> page_mass, int k) {
  const size_t kk = std::min<size_t>(std::max(k, 0), page_mass.size());
  std::partial_sort(page_mass.begin(), page_mass.begin() + kk, page_mass.end(), std::greater<>());
  for (size_t i = 0; i < kk; ++i) edge += page_mass[i];
  return edge;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Reads a little-endian float32 C-order 2-D .npy file.
Status ReadNpy(const std::string& path, std::vector<float>* data, int* rows, int* cols) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError("cannot open " + path);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) return InvalidArgumentError(path + ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) return InvalidArgumentError(path + ": truncated .npy header");
  if (header.find("'descr': '<f4'") == std::string::npos)
    return InvalidArgumentError(path + ": dtype must be float32 ('<f4'); header: " + header);
  if (header.find("'fortran_order': False") == std::string::npos) return InvalidArgumentError(path + ": must be C order");
  const size_t sp = header.find("'shape': (");
  if (sp == std::string::npos) return InvalidArgumentError(path + ": no shape in header");
  long long r = 0, c = 0;
  if (std::sscanf(header.c_str() + sp + 10, "%lld, %lld", &r, &c) != 2 || r <= 0 || c <= 0)
    return InvalidArgumentError(path + ": shape must be 2-D [n, d]; header: " + header);
  data->resize(static_cast<size_t>(r) * c);
  if (!f.read(reinterpret_cast<char*>(data->data()), data->size() * 4))
    return InvalidArgumentError(path + ": truncated data (expected " + std::to_string(r * c) + " floats)");
  *rows = static_cast<int>(r);
  *cols = static_cast<int>(c);
  return Status::Ok();
}

struct Args {
  std::string keys_file, queries_file, dump_file, dtype = "f32";
  int keys = 32768, dim = 128, queries = 200, page_size = 16, budget = 16, sink = 2, window = 2;
  int insert_tokens = 4096;
  int group = 1;  // query heads of one KV head selecting together (a GQA group, as served)
  kvstore::GroupMerge merge = kvstore::RetrievalPolicy{}.merge;  // how a group's lists merge (the serving default)
  int profile_loops = 0;  // > 0: only time sparse Select over the queries this many times (for profilers)
  int profile_evict_mb = 0;  // with profile_loops: bytes streamed through between queries (cold caches)
  int profile_builds = 0;  // > 0: only rebuild the tree this many more times and report the median build cpu
  int profile_parent_search = 0;  // > 0: only time the int8 parent search kernel this many times
  bool json = false, faiss = true;
  // The serving preset (kvstore::kServingDciPreset), as the cluster builds its trees; --reference
  // for DciParams{}, --tuned / --flat for the others.
  DciParams dci = *kvstore::DciParamsPreset(kvstore::kServingDciPreset);
  std::string family = "default";  // synthetic keys (kvstore::SyntheticFamily)
  uint64_t seed = 7;
};

void Usage() {
  std::fprintf(stderr,
               "icecache-bench retrieval [--keys-file K.npy --queries-file Q.npy | --keys N --dim D --queries Q\n"
               "  [--family default|scattered|outliers|drift|broad|hard (kvstore::SyntheticFamily)] [--seed 7]]\n"
               "  [--page-size 16] [--budget-pages 16] [--sink-pages 2] [--window-pages 2] [--dtype f32|bf16|f16]\n"
               "  [--fov-min 30] [--fov-fraction 1.5e-3] [--fov-sqrt 0] [--group-fov 0 (GQA groups only)]\n"
               "  [--cell-fraction 0.8] [--p1 0.01] [--p2 0.2]\n"
               "  [--exact-parent-max 3000] [--simple 1] [--composite 1] [--exhaustive-upper]\n"
               "  [--tuned | --flat | --reference (DciParams::Tuned() / Flat() / DciParams{}; default: the serving\n"
               "   preset, kvstore::kServingDciPreset; give it before other tree options)]\n"
               "  [--centroid-cells 0|1] [--centroid-bonus B] [--norm-headroom 1.0] [--dci-candidates 64]\n"
               "  [--bf16-parents 0|1] [--int8-parents 0|1] [--leaf-layout projection|position (DciParams::leaf_layout)]\n"
               "  [--insert-tokens 4096] [--no-faiss] [--profile-loops N (only sparse selections, N passes; per --group)] [--profile-evict-mb M]\n"
               "  [--profile-builds N (only rebuilds, N times; median build cpu)]\n"
               "  [--profile-parent-search N (only the build's int8 parent search kernel, N times; median cpu)]\n"
               "  [--group G (queries G at a time select one page set, as a GQA group of G query heads is served;\n"
               "   consecutive queries form a group, as dump-keys writes them; 1: each query alone)]\n"
               "  [--group-merge rank|mass (kvstore::GroupMerge of every method; default the serving one, mass)]\n"
               "  [--json] [--dump-selection FILE]\n");
}

// The build's level-0 parent search alone, as DciParams::Tuned() runs it at this size: every key
// (QuantizeKeyI8) against n / 50 rows (p1 = 0.02; here every 50th key, QuantizeRowsI8) with
// ArgmaxDotI8 in chunks of 256 keys; augmented coordinates from the largest norm. Prints the
// median thread CPU of quantising the keys and of the arg-max over `reps` repetitions, and how
// often the int8 search picks the row of largest fp32 dot (what the keys' rounding costs).
int ProfileParentSearch(const std::vector<float>& keys, int n, int d, int reps) {
  const int nr = std::max(1, n / 50), ld = (nr + 31) / 32 * 32, quads = kvstore::I8Quads(d);
  std::vector<float> norm2(n), rows(static_cast<size_t>(nr) * d), row_extra(nr), extra(n);
  float mx = 0.f;
  for (int t = 0; t < n; ++t) mx = std::max(mx, norm2[t] = kvstore::DotF32(&keys[static_cast<size_t>(t) * d], &keys[static_cast<size_t>(t) * d], d));
  for (int t = 0; t < n; ++t) extra[t] = std::sqrt(std::max(0.f, mx - norm2[t]));
  for (int r = 0; r < nr; ++r) {
    std::copy_n(&keys[static_cast<size_t>(r) * 50 * d], d, &rows[static_cast<size_t>(r) * d]);
    row_extra[r] = extra[static_cast<size_t>(r) * 50];
  }
  std::vector<uint32_t> rows_t(static_cast<size_t>(quads) * ld), x(static_cast<size_t>(n) * quads);
  std::vector<int32_t> sums(n), best(n);
  kvstore::QuantizeRowsI8(rows.data(), nr, d, row_extra.data(), ld, rows_t.data());
  std::vector<double> quant_us, argmax_us;
  for (int rep = 0; rep < reps; ++rep) {
    const double c0 = ThreadCpuUs();
    for (int t = 0; t < n; ++t)
      sums[t] = kvstore::QuantizeKeyI8(&keys[static_cast<size_t>(t) * d], d, extra[t], &x[static_cast<size_t>(t) * quads], nullptr,
                                        kvstore::kI8ParentKeyMax);
    const double c1 = ThreadCpuUs();
    for (int b = 0; b < n; b += 256)
      kvstore::ArgmaxDotI8(&x[static_cast<size_t>(b) * quads], &sums[b], std::min(256, n - b), rows_t.data(), ld, nr, quads,
                           &best[b]);
    argmax_us.push_back(ThreadCpuUs() - c1);
    quant_us.push_back(c1 - c0);
  }
  const double vnni = static_cast<double>(n) * ((nr + 31) / 32) * 2 * quads;  // zmm vpdpbusd issued
  // How close the int8 search comes to the exact one: for every 4th key, whether it picked the row
  // of the largest fp32 augmented dot, and the dot it gave up, relative to the best dot's distance
  // from the mean row's (1 = as bad as a row drawn at random).
  int agree = 0, checked = 0;
  double shortfall = 0;
  for (int t = 0; t < n; t += 4, ++checked) {
    const float* k = &keys[static_cast<size_t>(t) * d];
    double bestd = -1e300, mean = 0, chosen = 0;
    int arg = 0;
    for (int r = 0; r < nr; ++r) {
      const double dot = kvstore::DotF32(k, &rows[static_cast<size_t>(r) * d], d) + double(extra[t]) * row_extra[r];
      mean += dot / nr;
      if (dot > bestd) bestd = dot, arg = r;
      if (r == best[t]) chosen = dot;
    }
    agree += arg == best[t];
    if (bestd > mean) shortfall += (bestd - chosen) / (bestd - mean);
  }
  std::printf("parent search: %d keys x %d rows, d %d: quantise %.2f ms, arg-max %.2f ms thread cpu (medians of %d); "
              "%.1f M vpdpbusd; exact fp32 parent %.4f of keys, dot shortfall %.5f\n",
              n, nr, d, Median(quant_us) / 1000.0, Median(argmax_us) / 1000.0, reps, vnni / 1e6,
              static_cast<double>(agree) / checked, shortfall / checked);
  return 0;
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (k == "--json") { a->json = true; continue; }
    if (k == "--no-faiss") { a->faiss = false; continue; }
    if (k == "--exhaustive-upper") { a->dci.exhaustive_upper = true; continue; }
    if (k == "--tuned") { a->dci = DciParams::Tuned(); continue; }
    if (k == "--flat") { a->dci = DciParams::Flat(); continue; }
    if (k == "--reference") { a->dci = DciParams{}; continue; }
    if (k == "--help" || k == "-h") return false;
    const char* v = val();
    if (v == nullptr) { std::fprintf(stderr, "retrieval: %s needs a value\n", k.c_str()); return false; }
    if (k == "--keys-file") a->keys_file = v;
    else if (k == "--queries-file") a->queries_file = v;
    else if (k == "--dump-selection") a->dump_file = v;
    else if (k == "--family") a->family = v;
    else if (k == "--seed") a->seed = std::strtoull(v, nullptr, 10);
    else if (k == "--dtype") a->dtype = v;
    else if (k == "--keys") a->keys = std::atoi(v);
    else if (k == "--dim") a->dim = std::atoi(v);
    else if (k == "--queries") a->queries = std::atoi(v);
    else if (k == "--page-size") a->page_size = std::atoi(v);
    else if (k == "--budget-pages") a->budget = std::atoi(v);
    else if (k == "--sink-pages") a->sink = std::atoi(v);
    else if (k == "--window-pages") a->window = std::atoi(v);
    else if (k == "--insert-tokens") a->insert_tokens = std::atoi(v);
    else if (k == "--group") a->group = std::atoi(v);
    else if (k == "--profile-loops") a->profile_loops = std::atoi(v);
    else if (k == "--profile-builds") a->profile_builds = std::atoi(v);
    else if (k == "--profile-parent-search") a->profile_parent_search = std::atoi(v);
    else if (k == "--profile-evict-mb") a->profile_evict_mb = std::atoi(v);
    else if (k == "--fov-min") a->dci.fov_min = std::atoi(v);
    else if (k == "--fov-fraction") a->dci.fov_fraction = std::atof(v);
    else if (k == "--fov-sqrt") a->dci.fov_sqrt = std::atof(v);
    else if (k == "--group-fov") a->dci.group_fov = std::atof(v);
    else if (k == "--centroid-cells") a->dci.centroid_cells = std::atoi(v) != 0;
    else if (k == "--centroid-bonus") a->dci.centroid_bonus = std::atof(v);
    else if (k == "--cell-fraction") a->dci.cell_score_fraction = std::atof(v);
    else if (k == "--p1") a->dci.p1 = std::atof(v);
    else if (k == "--p2") a->dci.p2 = std::atof(v);
    else if (k == "--exact-parent-max") a->dci.exact_parent_max_nodes = std::atoi(v);
    else if (k == "--simple") a->dci.num_simple = std::atoi(v);
    else if (k == "--composite") a->dci.num_composite = std::atoi(v);
    else if (k == "--dci-candidates") a->dci.dci_parent_candidates = std::atoi(v);
    else if (k == "--norm-headroom") a->dci.norm_headroom = std::atof(v);
    else if (k == "--bf16-parents") a->dci.bf16_parent_search = std::atoi(v) != 0;
    else if (k == "--group-merge") {
      auto merge = kvstore::GroupMergeNamed(v);
      if (!merge.ok()) { std::fprintf(stderr, "retrieval: --group-merge: %s\n", merge.status().message().c_str()); return false; }
      a->merge = *merge;
    }
    else if (k == "--int8-parents") a->dci.int8_parent_search = std::atoi(v) != 0;
    else if (k == "--leaf-layout") {
      const std::string l = v;
      if (l == "projection") a->dci.leaf_layout = kvstore::LeafLayout::kProjection;
      else if (l == "position") a->dci.leaf_layout = kvstore::LeafLayout::kPosition;
      else { std::fprintf(stderr, "retrieval: --leaf-layout must be projection or position, got %s\n", v); return false; }
    }
    else { std::fprintf(stderr, "retrieval: unknown option %s\n", k.c_str()); return false; }
  }
  if (a->group < 1) { std::fprintf(stderr, "retrieval: --group must be >= 1, got %d\n", a->group); return false; }
  return true;
}

// Attention weights (softmax of q.k / sqrt(d)) over all keys, and the mass of the best `t` tokens.
struct Weights {
  std::vector<double> w;
  std::vector<double> sorted_prefix;  // prefix sums of w sorted descending
};
Weights ComputeWeights(const std::vector<float>& keys, int n, int d, const float* q) {
  Weights r;
  r.w.resize(n);
  double mx = -1e300, z = 0;
  const double scale = 1.0 / std::sqrt(double(d));
  for (int t = 0; t < n; ++t) {
    double s = 0;
    for (int i = 0; i < d; ++i) s += double(keys[size_t(t) * d + i]) * q[i];
    r.w[t] = s * scale;
    mx = std::max(mx, r.w[t]);
  }
  for (auto& x : r.w) z += (x = std::exp(x - mx));
  for (auto& x : r.w) x /= z;
  std::vector<double> s = r.w;
  std::sort(s.begin(), s.end(), std::greater<>());
  r.sorted_prefix.resize(n + 1, 0.0);
  for (int i = 0; i < n; ++i) r.sorted_prefix[i + 1] = r.sorted_prefix[i] + s[i];
  return r;
}

double MassRecall(const Weights& w, const std::vector<int64_t>& tokens) {
  double got = 0;
  for (int64_t t : tokens) got += w.w[t];
  const double best = w.sorted_prefix[std::min<size_t>(tokens.size(), w.w.size())];
  return best > 0 ? got / best : 1.0;
}

std::vector<int64_t> SelectedTokens(const SequenceCache& seq, const PageSelection& sel) {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < seq.sink_tokens(); ++t) out.push_back(t);
  for (int64_t t = seq.window_start(); t < seq.num_tokens(); ++t) out.push_back(t);
  const kvstore::DciTree* tree = seq.tree(0, 0);
  for (int32_t leaf : sel.tree_leaf) {
    if (leaf < 0) continue;
    for (int64_t p : tree->LeafPositions(leaf)) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int RunRetrieval(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    Usage();
    return 2;
  }
  std::vector<float> keys, queries;
  std::vector<int32_t> topic;  // synthetic keys: the generator's topic of each key
  int n = 0, d = 0, nq = 0;
  if (!a.keys_file.empty()) {
    if (a.queries_file.empty()) { std::fprintf(stderr, "retrieval: --keys-file needs --queries-file\n"); return 2; }
    int qd = 0;
    Status s = ReadNpy(a.keys_file, &keys, &n, &d);
    if (s.ok()) s = ReadNpy(a.queries_file, &queries, &nq, &qd);
    if (s.ok() && qd != d) s = InvalidArgumentError("queries have dim " + std::to_string(qd) + ", keys " + std::to_string(d));
    if (!s.ok()) { std::fprintf(stderr, "retrieval: %s\n", s.ToString().c_str()); return 1; }
  } else {
    n = a.keys;
    d = a.dim;
    nq = a.queries;
    auto fam = kvstore::SyntheticFamily(a.family);
    if (!fam.ok()) { std::fprintf(stderr, "retrieval: --family: %s\n", fam.status().message().c_str()); return 2; }
    fam->seed = a.seed;
    auto data = kvstore::MakeSyntheticData(n, d, nq, *fam);
    keys = std::move(data.keys);
    queries = std::move(data.queries);
    topic = std::move(data.topic);
  }
  if (a.profile_parent_search > 0) return ProfileParentSearch(keys, n, d, a.profile_parent_search);
  kernels::DType dtype = a.dtype == "bf16" ? kernels::DType::kBF16 : a.dtype == "f16" ? kernels::DType::kF16 : kernels::DType::kF32;
  std::vector<float> values(keys.size());
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> g;
    for (auto& v : values) v = g(rng);
  }
  kvstore::PagePoolOptions po;
  po.page_size = a.page_size;
  po.head_dim = d;
  po.dtype = dtype;
  po.num_pages = 6 * (static_cast<int64_t>(n) / a.page_size + 64) + 1024;  // tree + token-order copy
  po.zero_fill = true;  // a serving pool is long-lived: first-touch page faults are not part of a build
  auto pool_or = PagePool::Create(po);
  if (!pool_or.ok()) { std::fprintf(stderr, "retrieval: %s\n", pool_or.status().ToString().c_str()); return 1; }
  auto pool = std::move(pool_or).value();
  kvstore::SequenceCacheOptions so;
  so.num_layers = 1;
  so.num_kv_heads = 1;
  so.dense_layers = 0;
  so.sink_pages = a.sink;
  so.window_pages = a.window;
  so.dci = a.dci;
  auto seq_or = SequenceCache::Create(so, pool.get());
  if (!seq_or.ok()) { std::fprintf(stderr, "retrieval: %s\n", seq_or.status().ToString().c_str()); return 1; }
  auto seq = std::move(seq_or).value();
  const float* kp = keys.data();
  const float* vp = values.data();
  auto t0 = Clock::now();
  double c0 = ThreadCpuUs();
  Status bs = seq->Build(&kp, &vp, n);  // one head on the calling thread
  const double build_ms = Us(t0, Clock::now()) / 1000.0;
  const double build_cpu_ms = (ThreadCpuUs() - c0) / 1000.0;
  if (!bs.ok()) { std::fprintf(stderr, "retrieval: %s\n", bs.ToString().c_str()); return 1; }

  if (a.profile_builds > 0) {
    std::vector<double> cpu{build_cpu_ms * 1000.0};
    for (int i = 0; i < a.profile_builds; ++i) {
      auto again_or = SequenceCache::Create(so, pool.get());
      if (!again_or.ok()) { std::fprintf(stderr, "retrieval: %s\n", again_or.status().ToString().c_str()); return 1; }
      seq.reset();  // the previous tree's pages go back to the pool first
      seq = std::move(again_or).value();
      const double c = ThreadCpuUs();
      Status s = seq->Build(&kp, &vp, n);
      cpu.push_back(ThreadCpuUs() - c);
      if (!s.ok()) { std::fprintf(stderr, "retrieval: %s\n", s.ToString().c_str()); return 1; }
    }
    std::printf("profile: %zu builds of %d keys, median %.2f ms thread cpu (min %.2f)\n", cpu.size(), n, Median(cpu) / 1000.0,
                *std::min_element(cpu.begin(), cpu.end()) / 1000.0);
    return 0;
  }
  Retriever sparse(RetrievalPolicy{a.budget, RetrievalMode::kSparse, a.merge});
  if (a.profile_loops > 0) {
    std::vector<double> cpu;
    PageSelection sel;
    std::vector<uint64_t> evict(static_cast<size_t>(a.profile_evict_mb) << 17, 1);
    uint64_t sink = 0;
    for (int loop = 0; loop < a.profile_loops; ++loop) {
      for (int j = 0; j < nq; j += a.group) {  // one selection per GQA group, as the main loop
        for (size_t e = 0; e < evict.size(); e += 8) sink += evict[e]++;
        const double c = ThreadCpuUs();
        Status s = sparse.Select({seq.get()}, 0, queries.data() + static_cast<size_t>(j) * d, std::min(a.group, nq - j), &sel);
        cpu.push_back(ThreadCpuUs() - c);
        if (!s.ok()) { std::fprintf(stderr, "retrieval: %s\n", s.ToString().c_str()); return 1; }
      }
    }
    std::printf("profile: %zu sparse selections, median %.1f us thread cpu (build %.2f ms cpu)%s\n", cpu.size(), Median(cpu),
                build_cpu_ms, sink == 1 ? " " : "");
    return 0;
  }
  Retriever oracle(RetrievalPolicy{a.budget, RetrievalMode::kOracle, a.merge});
  // Quest over the same keys in token order.
  kvstore::SequenceCacheOptions qo = so;
  qo.layout = kvstore::SparseLayout::kTokenOrder;
  auto quest_seq_or = SequenceCache::Create(qo, pool.get());
  Status qs = quest_seq_or.ok() ? (*quest_seq_or)->Build(&kp, &vp, n) : quest_seq_or.status();
  if (!qs.ok()) { std::fprintf(stderr, "retrieval: quest layout: %s\n", qs.ToString().c_str()); return 1; }
  auto quest_seq = std::move(quest_seq_or).value();
  Retriever quest(RetrievalPolicy{a.budget, RetrievalMode::kQuest, a.merge});
  std::unordered_map<int32_t, int64_t> middle_first;  // quest middle page -> its first position
  for (size_t i = 0; i < quest_seq->middle_pages(0, 0).size(); ++i)
    middle_first[quest_seq->middle_pages(0, 0)[i]] = quest_seq->sink_tokens() + static_cast<int64_t>(i) * a.page_size;
  const int k_pages = std::max(0, a.budget - static_cast<int>(seq->sink_pages(0, 0).size()) -
                                      static_cast<int>(seq->window_pages(0, 0).size()));
  double quest_mass = 0, contiguous_mass = 0, kept_sparse = 0, kept_oracle = 0, kept_quest = 0, kept_contiguous = 0,
         kept_leaf_bound = 0, kept_topic_bound = 0;
  // The topic layout (synthetic keys): the middle tokens grouped by their generator topic, in token
  // order within a topic, cut into pages of page_size.
  std::vector<std::vector<int64_t>> topic_pages;
  if (!topic.empty()) {
    std::vector<int64_t> order;
    for (int64_t t = seq->sink_tokens(); t < seq->window_start(); ++t) order.push_back(t);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return topic[x] < topic[y]; });
    for (size_t i = 0; i < order.size();) {
      std::vector<int64_t> page;
      const int32_t tp = topic[order[i]];
      while (i < order.size() && topic[order[i]] == tp && static_cast<int>(page.size()) < a.page_size) page.push_back(order[i++]);
      topic_pages.push_back(std::move(page));
    }
  }
  std::vector<double> quest_cpu_us;
  std::vector<double> query_us, exact_us, query_cpu_us, exact_cpu_us, oracle_cpu_us;
  // The exact baseline scans the same keys stored in the same element type, contiguously.
  std::vector<uint8_t> stored(keys.size() * kernels::DTypeSize(dtype));
  kvstore::RowFromF32(dtype, keys.data(), stored.data(), static_cast<int>(keys.size()));
  double mass = 0, page_recall = 0, oracle_mass = 0;
  size_t tokens_total = 0;
  double tokens_scored = 0, cells_expanded = 0;
  std::FILE* dump = a.dump_file.empty() ? nullptr : std::fopen(a.dump_file.c_str(), "w");
  if (!a.dump_file.empty() && dump == nullptr) { std::fprintf(stderr, "retrieval: cannot write %s\n", a.dump_file.c_str()); return 1; }
  std::vector<float> scores(n);
  std::vector<int32_t> idx(n);
  std::vector<std::vector<int64_t>> selections(nq);
  std::vector<Weights> weights(nq);
  // With --group G the G queries of a group share one selection (sparse, oracle and Quest alike:
  // each head ranks its own leaves or pages, merged by the serving kvstore::GroupMerge, as Retriever serves a GQA group);
  // kept mass is still per query, against that query's own softmax. Selection times are per group.
  PageSelection sel, best, qsel;
  for (int j = 0; j < nq; ++j) {
    const float* q = queries.data() + static_cast<size_t>(j) * d;
    const int gsize = std::min(a.group, nq - j / a.group * a.group);
    if (j % a.group == 0) {
      auto a0 = Clock::now();
      double ac = ThreadCpuUs();
      Status s = sparse.Select({seq.get()}, 0, q, gsize, &sel);
      query_cpu_us.push_back(ThreadCpuUs() - ac);
      query_us.push_back(Us(a0, Clock::now()));
      if (!s.ok()) { std::fprintf(stderr, "retrieval: %s\n", s.ToString().c_str()); return 1; }
      double oc = ThreadCpuUs();
      (void)oracle.Select({seq.get()}, 0, q, gsize, &best);
      oracle_cpu_us.push_back(ThreadCpuUs() - oc);
      std::vector<std::vector<kvstore::ScoredLeaf>> tmp;
      kvstore::QueryStats st;
      seq->tree(0, 0)->QueryGroup(q, gsize, a.budget, &tmp, &st);
      tokens_scored += static_cast<double>(st.tokens_scored) * gsize;  // per query: divided by nq below
      cells_expanded += static_cast<double>(st.cells_expanded) * gsize;
      const double qc = ThreadCpuUs();
      Status qst = quest.Select({quest_seq.get()}, 0, q, gsize, &qsel);
      quest_cpu_us.push_back(ThreadCpuUs() - qc);
      if (!qst.ok()) { std::fprintf(stderr, "retrieval: quest: %s\n", qst.ToString().c_str()); return 1; }
    }
    std::vector<int64_t> tokens = SelectedTokens(*seq, sel);
    tokens_total += tokens.size();
    // Exact baseline: SIMD scan of all keys (fp32, contiguous) + top-T tokens.
    auto e0 = Clock::now();
    double ec = ThreadCpuUs();
    kvstore::ScoreRows(dtype, stored.data(), n, d, q, scores.data());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t T = std::min<size_t>(tokens.size(), n);
    std::nth_element(idx.begin(), idx.begin() + (T > 0 ? T - 1 : 0), idx.end(), [&](int32_t x, int32_t y) { return scores[x] > scores[y]; });
    exact_cpu_us.push_back(ThreadCpuUs() - ec);
    exact_us.push_back(Us(e0, Clock::now()));
    weights[j] = ComputeWeights(keys, n, d, q);
    mass += MassRecall(weights[j], tokens);
    const std::vector<int64_t> best_tokens = SelectedTokens(*seq, best);
    oracle_mass += MassRecall(weights[j], best_tokens);
    {
      std::vector<int64_t> qt;
      for (int64_t t = 0; t < quest_seq->sink_tokens(); ++t) qt.push_back(t);
      for (int64_t t = quest_seq->window_start(); t < n; ++t) qt.push_back(t);
      for (int32_t page : qsel.page_ids) {
        auto it = middle_first.find(page);
        if (it == middle_first.end()) continue;
        for (int s2 = 0; s2 < a.page_size; ++s2) qt.push_back(it->second + s2);
      }
      quest_mass += MassRecall(weights[j], qt);
      // Exact contiguous pages: the K middle pages of most attention mass.
      std::vector<std::pair<double, int64_t>> pages;
      for (int64_t first = seq->sink_tokens(); first < seq->window_start(); first += a.page_size) {
        double m = 0;
        for (int64_t t = first; t < std::min<int64_t>(first + a.page_size, seq->window_start()); ++t) m += weights[j].w[t];
        pages.push_back({m, first});
      }
      const size_t kk = std::min<size_t>(k_pages, pages.size());
      std::partial_sort(pages.begin(), pages.begin() + kk, pages.end(), std::greater<>());
      std::vector<int64_t> ct;
      for (int64_t t = 0; t < seq->sink_tokens(); ++t) ct.push_back(t);
      for (int64_t t = seq->window_start(); t < n; ++t) ct.push_back(t);
      for (size_t i = 0; i < kk; ++i)
        for (int64_t t = pages[i].second; t < std::min<int64_t>(pages[i].second + a.page_size, seq->window_start()); ++t) ct.push_back(t);
      contiguous_mass += MassRecall(weights[j], ct);
      auto kept = [&](const std::vector<int64_t>& toks) {
        double m = 0;
        for (int64_t t : toks) m += weights[j].w[t];
        return m;
      };
      // The layouts' bounds: the tree's K leaves of most attention mass (the oracle ranks leaves by
      // their best token instead, as the search does), and on synthetic keys the topic-pure pages'.
      {
        double edge = 0;  // sink and window, which every layout keeps
        for (int64_t t = 0; t < seq->sink_tokens(); ++t) edge += weights[j].w[t];
        for (int64_t t = seq->window_start(); t < n; ++t) edge += weights[j].w[t];
        const kvstore::DciTree* tree = seq->tree(0, 0);
        std::vector<double> lm(tree->num_leaves());
        for (int32_t leaf = 0; leaf < tree->num_leaves(); ++leaf)
          for (int64_t p : tree->LeafPositions(leaf)) lm[leaf] += weights[j].w[p];
        kept_leaf_bound += KeptWithBestPages(edge, std::move(lm), k_pages);
        if (!topic_pages.empty()) {
          std::vector<double> pm(topic_pages.size());
          for (size_t i = 0; i < topic_pages.size(); ++i)
            for (int64_t t : topic_pages[i]) pm[i] += weights[j].w[t];
          kept_topic_bound += KeptWithBestPages(edge, std::move(pm), k_pages);
        }
      }
      kept_sparse += kept(tokens);
      kept_oracle += kept(best_tokens);
      kept_quest += kept(qt);
      kept_contiguous += kept(ct);
    }
    int hit = 0, want = 0;
    std::vector<int32_t> got_leaves(sel.tree_leaf.begin(), sel.tree_leaf.end());
    std::sort(got_leaves.begin(), got_leaves.end());
    for (int32_t leaf : best.tree_leaf) {
      if (leaf < 0) continue;
      ++want;
      hit += std::binary_search(got_leaves.begin(), got_leaves.end(), leaf);
    }
    page_recall += want ? double(hit) / want : 1.0;
    if (dump) {
      nlohmann::json line = {{"query", j}, {"tokens", tokens}};
      std::fprintf(dump, "%s\n", line.dump().c_str());
    }
    selections[j] = std::move(tokens);
  }
  if (dump) std::fclose(dump);
  // The same queries back to back (as the faiss sweeps below run theirs): nothing else touches
  // the caches between two queries here, unlike the loop above.
  std::vector<double> b2b_cpu_us;
  {
    PageSelection sel;
    for (int j = 0; j < nq; ++j) {
      const double c = ThreadCpuUs();
      (void)sparse.Select({seq.get()}, 0, queries.data() + static_cast<size_t>(j) * d, 1, &sel);
      b2b_cpu_us.push_back(ThreadCpuUs() - c);
    }
  }
  mass /= nq;
  oracle_mass /= nq;
  quest_mass /= nq;
  contiguous_mass /= nq;
  kept_sparse /= nq;
  kept_oracle /= nq;
  kept_quest /= nq;
  kept_contiguous /= nq;
  kept_leaf_bound /= nq;
  kept_topic_bound /= nq;
  page_recall /= nq;
  const double qmed = Median(query_us), emed = Median(exact_us);
  const double qcpu = Median(query_cpu_us), ecpu = Median(exact_cpu_us);
  const int T = static_cast<int>(tokens_total / std::max(1, nq));

  // Insertion: a tree over all but the last tokens, then pages of page_size tokens inserted.
  double insert_us = 0, insert_cpu_us = 0;
  const int ins = std::min(a.insert_tokens, n / 4) / a.page_size * a.page_size;
  if (ins > 0) {
    const int base = n - ins;
    auto tree = kvstore::DciTree::Build(a.dci, pool.get(), 1, kvstore::TokenBlock{0, base, &kp, &vp, static_cast<size_t>(d)});
    if (!tree.ok()) { std::fprintf(stderr, "retrieval: %s\n", tree.status().ToString().c_str()); return 1; }
    auto i0 = Clock::now();
    double ic = ThreadCpuUs();
    for (int off = base; off < n; off += a.page_size) {
      const float* kk = keys.data() + static_cast<size_t>(off) * d;
      const float* vv = values.data() + static_cast<size_t>(off) * d;
      Status s = (*tree)->Insert(kvstore::TokenBlock{off, a.page_size, &kk, &vv, static_cast<size_t>(d)});
      if (!s.ok()) { std::fprintf(stderr, "retrieval: %s\n", s.ToString().c_str()); return 1; }
    }
    insert_us = Us(i0, Clock::now()) / ins;
    insert_cpu_us = (ThreadCpuUs() - ic) / ins;
  }

  nlohmann::json out = {
      {"workload", "retrieval"},
      {"n", n}, {"dim", d}, {"queries", nq}, {"group", a.group}, {"group_merge", kvstore::GroupMergeName(a.merge)}, {"dtype", a.dtype},
      {"page_size", a.page_size}, {"budget_pages", a.budget}, {"sink_pages", a.sink}, {"window_pages", a.window},
      {"tokens_selected_mean", T}, {"tokens_scored_mean", tokens_scored / nq}, {"cells_expanded_mean", cells_expanded / nq},
      {"levels", seq->tree(0, 0)->level_counts()},
      {"leaves", seq->tree(0, 0)->num_leaves()},
      {"mass_recall", mass}, {"oracle_mass_recall", oracle_mass}, {"page_recall", page_recall},
      {"quest_mass_recall", quest_mass}, {"contiguous_mass_recall", contiguous_mass},
      {"kept_mass", {{"icecache", kept_sparse}, {"oracle", kept_oracle}, {"quest", kept_quest}, {"contiguous", kept_contiguous},
                     {"leaves_by_mass", kept_leaf_bound}}},
      {"quest_cpu_us_median", Median(quest_cpu_us)},
      {"query_us_median", qmed}, {"exact_us_median", emed}, {"query_over_exact", emed > 0 ? qmed / emed : 0},
      {"query_cpu_us_median", qcpu}, {"exact_cpu_us_median", ecpu}, {"query_over_exact_cpu", ecpu > 0 ? qcpu / ecpu : 0},
      {"oracle_cpu_us_median", Median(oracle_cpu_us)}, {"query_back_to_back_cpu_us_median", Median(b2b_cpu_us)},
      {"build_ms", build_ms}, {"build_cpu_ms", build_cpu_ms}, {"insert_us_per_token", insert_us},
      {"insert_cpu_us_per_token", insert_cpu_us},
      {"params", {{"fov_min", a.dci.fov_min}, {"fov_fraction", a.dci.fov_fraction}, {"fov_sqrt", a.dci.fov_sqrt}, {"group_fov", a.dci.group_fov},
                  {"centroid_cells", a.dci.centroid_cells}, {"centroid_bonus", a.dci.centroid_bonus},
                  {"cell_score_fraction", a.dci.cell_score_fraction}, {"p1", a.dci.p1}, {"p2", a.dci.p2},
                  {"exact_parent_max_nodes", a.dci.exact_parent_max_nodes}, {"m", a.dci.num_simple},
                  {"exhaustive_upper", a.dci.exhaustive_upper}, {"norm_headroom", a.dci.norm_headroom},
                  {"L", a.dci.num_composite}, {"bf16_parent_search", a.dci.bf16_parent_search}, {"int8_parent_search", a.dci.int8_parent_search},
                  {"leaf_layout", a.dci.leaf_layout == kvstore::LeafLayout::kPosition ? "position" : "projection"}}}};
  if (!topic_pages.empty()) out["kept_mass"]["topic_pages"] = kept_topic_bound;

#ifdef ICECACHE_HAVE_FAISS
  if (a.faiss) {
    omp_set_num_threads(1);
    // Each faiss index returns the top-T tokens; its mass recall is matched against ours.
    auto sweep = [&](faiss::Index* index, const char* knob, const std::vector<int>& values_k, auto set) {
      nlohmann::json rows = nlohmann::json::array();
      nlohmann::json matched;
      std::vector<float> dist(T);
      std::vector<faiss::Index::idx_t> labels(T);
      for (int kv : values_k) {
        set(kv);
        std::vector<double> us, cpu;
        double rec = 0;
        for (int j = 0; j < nq; ++j) {
          auto f0 = Clock::now();
          double fc = ThreadCpuUs();
          index->search(1, queries.data() + static_cast<size_t>(j) * d, T, dist.data(), labels.data());
          cpu.push_back(ThreadCpuUs() - fc);
          us.push_back(Us(f0, Clock::now()));
          std::vector<int64_t> toks;
          for (auto l : labels) if (l >= 0) toks.push_back(l);
          rec += MassRecall(weights[j], toks);
        }
        rec /= nq;
        nlohmann::json row = {{knob, kv}, {"mass_recall", rec}, {"query_us_median", Median(us)}, {"query_cpu_us_median", Median(cpu)}};
        rows.push_back(row);
        if (matched.is_null() && rec >= mass) matched = row;
      }
      return nlohmann::json{{"sweep", rows}, {"matched", matched}};
    };
    {
      auto b0 = Clock::now();
      faiss::IndexHNSWFlat hnsw(d, 16, faiss::METRIC_INNER_PRODUCT);
      hnsw.hnsw.efConstruction = 64;
      hnsw.add(n, keys.data());
      const double hb = Us(b0, Clock::now()) / 1000.0;
      auto r = sweep(&hnsw, "efSearch", {16, 32, 64, 128, 256, 512, 1024, 2048},
                     [&](int ef) { hnsw.hnsw.efSearch = ef; });
      r["build_ms"] = hb;
      out["faiss_hnsw"] = r;
    }
    {
      const int nlist = std::max(16, static_cast<int>(4 * std::sqrt(double(n))));
      auto b0 = Clock::now();
      faiss::IndexFlatIP quant(d);
      faiss::IndexIVFFlat ivf(&quant, d, nlist, faiss::METRIC_INNER_PRODUCT);
      ivf.train(n, keys.data());
      ivf.add(n, keys.data());
      const double ib = Us(b0, Clock::now()) / 1000.0;
      auto r = sweep(&ivf, "nprobe", {1, 2, 4, 8, 16, 32, 64, 128, 256},
                     [&](int np) { ivf.nprobe = std::min(np, nlist); });
      r["build_ms"] = ib;
      r["nlist"] = nlist;
      out["faiss_ivf_flat"] = r;
    }
  }
#endif

  if (a.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("retrieval  n=%d d=%d queries=%d dtype=%s budget=%d pages (%d sink, %d window) x %d tokens\n", n, d, nq,
                a.dtype.c_str(), a.budget, a.sink, a.window, a.page_size);
    std::printf("  mass recall %.4f (oracle pages %.4f)  top-page recall %.4f  tokens %d  scored/query %.0f in %.0f cells\n", mass,
                oracle_mass, page_recall, T, tokens_scored / nq, cells_expanded / nq);
    std::printf("  kept attention mass: icecache %.4f, oracle pages %.4f, exact contiguous pages %.4f, quest %.4f"
                " (quest query %.1f us thread cpu); the tree's leaves of most mass %.4f\n",
                kept_sparse, kept_oracle, kept_contiguous, kept_quest, Median(quest_cpu_us), kept_leaf_bound);
    if (!topic_pages.empty()) std::printf("  the generator's topics paged in token order (a topic-pure layout's best pages) %.4f\n", kept_topic_bound);
    std::printf("  query %.1f us median, exact scan %.1f us  (ratio %.3f)   [thread cpu: %.1f vs %.1f us, ratio %.3f]\n", qmed,
                emed, emed > 0 ? qmed / emed : 0, qcpu, ecpu, ecpu > 0 ? qcpu / ecpu : 0);
    std::printf("  queries back to back: %.1f us thread cpu median\n", Median(b2b_cpu_us));
    std::printf("  build %.2f ms/head (cpu %.2f), insert %.3f us/token (cpu %.3f)\n", build_ms, build_cpu_ms, insert_us,
                insert_cpu_us);
    for (const char* key : {"faiss_hnsw", "faiss_ivf_flat"}) {
      if (!out.contains(key)) continue;
      std::printf("  %s: build %.1f ms, matched %s\n", key, out[key]["build_ms"].get<double>(), out[key]["matched"].dump().c_str());
    }
  }
  return 0;
}

}  // namespace
ICE_BENCH_WORKLOAD("retrieval", "IceCache page retrieval vs exact scan and faiss (recall, latency, build, insert)",
                   RunRetrieval);
}  // namespace icecache::bench
