// icecache-bench accuracy: passkey / needle retrieval accuracy of the project's own engine
// (model::Model) under different KV selections over the same IceCache layout (kvstore).
//
// Per prompt: prompt[0 .. n-2] is prefilled densely (model::DenseKvCache), its K/V are read back and
// built into a kvstore::SequenceCache (2 dense layers, sparse layers as sink + DCI tree + window).
// Then the last prompt token and the answer are decoded greedily under the method, so every answer
// token (the first included) is produced by the method's attention:
//   full      every page of every layer (RetrievalMode kFull);
//   oracle    sink + exact best-K tree leaves + window (RetrievalMode kOracle);
//   icecache  sink + DCI-tree top-K leaves + window (RetrievalMode kSparse, what serves);
//   window    sink + most recent pages only (StreamingLLM-style; the cache is built with a wider
//             window and the selection gets K = 0).
// Every method decodes through decode::IceCacheBackend, the decode worker's backend, on the
// model's device (the same selection, page cache and attention code that serve requests).
// Budget B tokens = B/16 pages: oracle/icecache use 1 sink + 1 window + (B/16 - 2) retrieved pages,
// window uses 1 sink + (B/16 - 1) window pages. A trial is correct when the greedy tokens equal
// the answer ids exactly. Prompts come from eval_prompts.jsonl (tools/train/passkey_lib.py).
// The DCI field of view (DciTree::FieldOfView() level-1 cells: max(fov_min, fov_fraction * n,
// fov_sqrt * sqrt(n)), n = tree tokens) can be
// swept: icecache runs once per (fov_min, fov_fraction) pair of the two lists, over the
// same prefill, so fov settings are compared on the same prompts in one run.
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/png_writer.h"
#include "bench/workload.h"
#include "decode_worker/icecache_backend.h"
#include "kvstore/page_pool.h"
#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "model/dense_kv_cache.h"
#include "model/model.h"

namespace icecache::bench {
namespace {

struct Prompt {
  std::string task;
  int context = 0, depth = 0;
  std::vector<int32_t> ids, answer;
};

StatusOr<std::vector<Prompt>> LoadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open " + path);
  std::vector<Prompt> out;
  std::string line;
  for (int ln = 1; std::getline(in, line); ++ln) {
    if (line.empty()) continue;
    try {
      auto j = nlohmann::json::parse(line);
      Prompt p;
      p.task = j.at("task").get<std::string>();
      p.context = j.at("context").get<int>();
      p.depth = j.at("depth").get<int>();
      p.ids = j.at("prompt_ids").get<std::vector<int32_t>>();
      p.answer = j.at("answer_ids").get<std::vector<int32_t>>();
      if (p.ids.size() < 2 || p.answer.empty()) return InvalidArgumentError(path + ":" + std::to_string(ln) + ": empty prompt/answer");
      out.push_back(std::move(p));
    } catch (const std::exception& e) {
      return InvalidArgumentError(path + ":" + std::to_string(ln) + ": " + e.what());
    }
  }
  return out;
}

struct Method {
  std::string name;
  int budget = 0;         // tokens; 0 for full
  bool fov_swept = false;  // icecache: dci carries one point of the fov sweep
  kvstore::DciParams dci;
  int ice_group = 1;       // ICE(r) layer reuse over the sparse layers (cache.ice_group)
};

struct TrialResult {
  bool correct = false;
  int64_t fov = 0;        // level-1 cells the query expands at this prompt's tree size
  double seconds = 0;     // wall: cache/tree build + decode
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Greedy decode of `p.answer.size()` tokens after feeding the last prompt token; true when exact.
StatusOr<bool> Decode(model::Model& m, model::AttentionBackend& be, const Prompt& p) {
  std::vector<float> logits;
  int32_t tok = p.ids.back();
  const int vocab = m.config().vocab_size;
  for (size_t i = 0; i < p.answer.size(); ++i) {
    model::SequenceInput in{0, std::span<const int32_t>(&tok, 1)};
    ICE_RETURN_IF_ERROR(m.Forward({&in, 1}, be, model::LogitsMode::kLastToken, &logits));
    tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    if (tok != p.answer[i]) return false;
  }
  return true;
}

StatusOr<bool> RunMethod(model::Model& m, kvstore::PagePool* pool, const std::vector<std::vector<float>>& k,
                         const std::vector<std::vector<float>>& v, int64_t n, const Prompt& p, const Method& meth,
                         int64_t* fov) {
  const auto shape = m.attention_shape();
  kvstore::SequenceCacheOptions o;
  o.num_layers = shape.num_layers;
  o.num_kv_heads = shape.num_kv_heads;
  o.dense_layers = 2;
  o.sink_pages = 1;
  o.dci = meth.dci;
  o.ice_group = meth.ice_group;
  const int pages = meth.budget / pool->page_size();
  o.window_pages = meth.name == "window" ? pages - 1 : 1;
  ICE_ASSIGN_OR_RETURN(auto cache, kvstore::SequenceCache::Create(o, pool));
  std::vector<const float*> kp, vp;
  for (int l = 0; l < shape.num_layers; ++l) {
    kp.push_back(k[l].data());
    vp.push_back(v[l].data());
  }
  ICE_RETURN_IF_ERROR(cache->Build(kp.data(), vp.data(), n));
  if (const kvstore::DciTree* t = cache->tree(o.dense_layers, 0)) {
    *fov = t->FieldOfView();
  }
  const kvstore::RetrievalMode mode = meth.name == "full"     ? kvstore::RetrievalMode::kFull
                                     : meth.name == "oracle" ? kvstore::RetrievalMode::kOracle
                                                             : kvstore::RetrievalMode::kSparse;  // window: K = 0
  decode::IceCacheBackendOptions bo;
  bo.device = m.device();
  ICE_ASSIGN_OR_RETURN(auto be, decode::IceCacheBackend::Create(shape, pool, bo));
  // full: any budget above sink + window (kFull takes every leaf).
  const int budget = meth.name == "full" ? o.sink_pages + o.window_pages + 1 : pages;
  ICE_RETURN_IF_ERROR(be->Import(0, std::move(cache), budget, mode));
  return Decode(m, *be, p);
}

StatusOr<TrialResult> RunTrial(model::Model& m, kvstore::PagePool* pool, const std::vector<std::vector<float>>& k,
                               const std::vector<std::vector<float>>& v, int64_t n, const Prompt& p,
                               const Method& meth) {
  TrialResult r;
  const double t0 = WallSeconds();
  ICE_ASSIGN_OR_RETURN(r.correct, RunMethod(m, pool, k, v, n, p, meth, &r.fov));
  r.seconds = WallSeconds() - t0;
  return r;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) if (!t.empty()) out.push_back(t);
  return out;
}

int ParseContext(const std::string& s) {
  if (!s.empty() && (s.back() == 'k' || s.back() == 'K')) return std::atoi(s.c_str()) * 1024;
  return std::atoi(s.c_str());
}

// A comma list of numbers, every item parsed whole; INVALID_ARGUMENT naming the flag and the item.
StatusOr<std::vector<int>> ParseIntList(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  for (const std::string& t : Split(s)) {
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(t.c_str(), &end, 10);
    if (end == t.c_str() || *end != '\0' || errno != 0 || x < std::numeric_limits<int>::min() ||
        x > std::numeric_limits<int>::max()) {
      return InvalidArgumentError(flag + ": '" + t + "' is not an integer");
    }
    out.push_back(static_cast<int>(x));
  }
  if (out.empty()) return InvalidArgumentError(flag + ": empty list");
  return out;
}

StatusOr<std::vector<double>> ParseDoubleList(const std::string& flag, const std::string& s) {
  std::vector<double> out;
  for (const std::string& t : Split(s)) {
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(t.c_str(), &end);
    if (end == t.c_str() || *end != '\0' || errno != 0 || !std::isfinite(x)) {
      return InvalidArgumentError(flag + ": '" + t + "' is not a finite number");
    }
    out.push_back(x);
  }
  if (out.empty()) return InvalidArgumentError(flag + ": empty list");
  return out;
}

// The DciParams of every (fov_min, fov_fraction) pair of the two lists (an empty list keeps the
// preset's value), each checked by kvstore::ValidateDciParams.
StatusOr<std::vector<kvstore::DciParams>> FovSweep(const kvstore::DciParams& base, const std::string& mins_s,
                                                   const std::string& fractions_s) {
  std::vector<int> mins{base.fov_min};
  std::vector<double> fractions{base.fov_fraction};
  if (!mins_s.empty()) {
    ICE_ASSIGN_OR_RETURN(mins, ParseIntList("--dci-fov-min", mins_s));
  }
  if (!fractions_s.empty()) {
    ICE_ASSIGN_OR_RETURN(fractions, ParseDoubleList("--dci-fov-fraction", fractions_s));
  }
  std::vector<kvstore::DciParams> out;
  for (int mn : mins) {
    for (double fr : fractions) {
      kvstore::DciParams d = base;
      d.fov_min = mn;
      d.fov_fraction = fr;
      Status st = kvstore::ValidateDciParams(d);
      if (!st.ok()) {
        char what[96];
        std::snprintf(what, sizeof(what), "--dci-fov-min %d / --dci-fov-fraction %g: ", mn, fr);
        return InvalidArgumentError(what + st.message());
      }
      out.push_back(d);
    }
  }
  return out;
}

// The text output's name of a method, e.g. "icecache b256 fov_min 32 frac 0.001".
std::string Label(const Method& m) {
  char buf[96];
  if (m.fov_swept) {
    std::snprintf(buf, sizeof(buf), "%s b%d fov_min %d frac %g", m.name.c_str(), m.budget, m.dci.fov_min,
                  m.dci.fov_fraction);
  } else if (m.budget > 0) {
    std::snprintf(buf, sizeof(buf), "%s b%d", m.name.c_str(), m.budget);
  } else {
    std::snprintf(buf, sizeof(buf), "%s", m.name.c_str());
  }
  return buf;
}

struct Cell {
  int correct = 0, trials = 0;
  int64_t fov = 0;       // of the last trial (the same within a context up to a cell or two)
  double seconds = 0;    // summed over trials
};

// Grid of heatmaps: one panel per (method, budget), panels left to right in the order given;
// inside a panel rows = contexts (top = shortest), columns = depths (left = 0%); colour from red
// (accuracy 0) to green (1); grey = no trial.
Status WritePlot(const std::string& path, const std::vector<Method>& methods, const std::vector<int>& contexts,
                 const std::vector<int>& depths, const std::map<std::tuple<int, int, int>, Cell>& cells) {
  const int cs = 20, gap = 12;
  const int pw = static_cast<int>(depths.size()) * cs, ph = static_cast<int>(contexts.size()) * cs;
  const int width = gap + static_cast<int>(methods.size()) * (pw + gap), height = ph + 2 * gap;
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3, 255);
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      for (size_t di = 0; di < depths.size(); ++di) {
        auto it = cells.find({static_cast<int>(mi), contexts[ci], depths[di]});
        uint8_t r = 160, g = 160, b = 160;
        if (it != cells.end() && it->second.trials > 0) {
          const double a = static_cast<double>(it->second.correct) / it->second.trials;
          r = static_cast<uint8_t>(std::lround(220 * (1 - a) + 30 * a));
          g = static_cast<uint8_t>(std::lround(40 * (1 - a) + 170 * a));
          b = 50;
        }
        const int x0 = gap + static_cast<int>(mi) * (pw + gap) + static_cast<int>(di) * cs;
        const int y0 = gap + static_cast<int>(ci) * cs;
        for (int y = y0 + 1; y < y0 + cs - 1; ++y) {
          for (int x = x0 + 1; x < x0 + cs - 1; ++x) {
            uint8_t* px = &rgb[(static_cast<size_t>(y) * width + x) * 3];
            px[0] = r, px[1] = g, px[2] = b;
          }
        }
      }
    }
  }
  return WritePng(path, width, height, rgb);
}

constexpr const char* kUsage =
    "usage: icecache-bench accuracy --model DIR [--prompts FILE (DIR/eval_prompts.jsonl)] [--task passkey|needle]\n"
    "         [--contexts 1k,2k,4k] [--depths 0,25,50,75,100] [--methods full,oracle,icecache,window]\n"
    "         [--budgets 64,128,256] [--trials N (max per cell)] [--dci default|tuned|flat (DciParams::Tuned()/Flat())]\n"
    "         [--dci-fov-min N[,N..] (field of view minimum, >= 1)]\n"
    "         [--dci-fov-fraction F[,F..] (field of view per tree token, [0, 1]; 0: constant fov_min)]\n"
    "         [--dci-group-fov G (cap on a GQA group's cells, G x fov; 0: none; default: the preset's)]\n"
    "         [--ice-group G (ICE(r): G consecutive sparse layers share a selection; 1 = off)]\n"
    "         [--json] [--plot FILE.png]\n"
    "methods: full, oracle, icecache, window (all through decode::IceCacheBackend)\n"
    "fov: icecache runs once per (fov_min, fov_fraction) pair of the two lists (default: the preset's);\n"
    "     the query expands DciTree::FieldOfView() = max(fov_min, ceil(fov_fraction * n), ceil(fov_sqrt * sqrt(n)))\n"
    "     level-1 cells, n = tree tokens (fov_sqrt: the preset's, 0 unless flat)\n";

int RunAccuracy(int argc, char** argv) {
  std::string dir, prompts_path, task = "passkey", plot;
  std::string contexts_s = "1k,2k,4k", depths_s = "0,25,50,75,100", methods_s = "full,oracle,icecache,window",
              budgets_s = "64,128,256";
  int max_trials = 1 << 30;
  bool json = false;
  kvstore::DciParams dci;
  std::string fov_mins_s, fov_fractions_s;
  std::optional<double> group_fov;  // unset: the preset's
  int ice_group = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool has = i + 1 < argc;
    if (f == "--model" && has) dir = argv[++i];
    else if (f == "--prompts" && has) prompts_path = argv[++i];
    else if (f == "--task" && has) task = argv[++i];
    else if (f == "--contexts" && has) contexts_s = argv[++i];
    else if (f == "--depths" && has) depths_s = argv[++i];
    else if (f == "--methods" && has) methods_s = argv[++i];
    else if (f == "--budgets" && has) budgets_s = argv[++i];
    else if (f == "--trials" && has) max_trials = std::atoi(argv[++i]);
    else if (f == "--plot" && has) plot = argv[++i];
    else if (f == "--json") json = true;
    else if (f == "--dci" && has && std::string(argv[i + 1]) == "default") ++i;
    else if (f == "--dci" && has && std::string(argv[i + 1]) == "tuned") dci = kvstore::DciParams::Tuned(), ++i;
    else if (f == "--dci" && has && std::string(argv[i + 1]) == "flat") dci = kvstore::DciParams::Flat(), ++i;
    else if (f == "--dci-fov-min" && has) fov_mins_s = argv[++i];
    else if (f == "--dci-fov-fraction" && has) fov_fractions_s = argv[++i];
    else if (f == "--dci-group-fov" && has) group_fov = std::atof(argv[++i]);
    else if (f == "--ice-group" && has) ice_group = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "accuracy: bad argument '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty() || max_trials < 1 || ice_group < 1) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (group_fov) dci.group_fov = *group_fov;  // out of range: refused by the sweep's validation
  auto sweep = FovSweep(dci, fov_mins_s, fov_fractions_s);
  if (!sweep.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", sweep.status().ToString().c_str());
    return 2;
  }
  if (prompts_path.empty()) prompts_path = dir + "/eval_prompts.jsonl";
  std::vector<int> contexts, depths, budgets;
  for (auto& s : Split(contexts_s)) contexts.push_back(ParseContext(s));
  for (auto& s : Split(depths_s)) depths.push_back(std::atoi(s.c_str()));
  for (auto& s : Split(budgets_s)) budgets.push_back(std::atoi(s.c_str()));
  std::vector<Method> methods;
  for (auto& name : Split(methods_s)) {
    if (name == "full") {
      methods.push_back({name, 0, false, dci, ice_group});
    } else if (name == "oracle" || name == "icecache" || name == "window") {
      for (int b : budgets) {
        const int min_pages = name == "window" ? 2 : 3;
        if (b % 16 != 0 || b / 16 < min_pages) {
          std::fprintf(stderr, "accuracy: budget %d for %s must be a multiple of 16 with >= %d pages\n", b,
                       name.c_str(), min_pages);
          return 2;
        }
        if (name == "icecache") {
          for (const kvstore::DciParams& d : *sweep) methods.push_back({name, b, true, d, ice_group});
        } else {
          methods.push_back({name, b, false, dci, ice_group});
        }
      }
    } else {
      std::fprintf(stderr, "accuracy: unknown method '%s'\n", name.c_str());
      return 2;
    }
  }
  auto prompts = LoadPrompts(prompts_path);
  if (!prompts.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", prompts.status().ToString().c_str());
    return 1;
  }
  auto model = model::Model::Load(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", model.status().ToString().c_str());
    return 1;
  }
  model::Model& m = **model;
  const auto shape = m.attention_shape();
  std::map<std::tuple<int, int, int>, Cell> cells;  // (method index, context, depth)
  std::map<std::pair<int, int>, int> used;
  std::vector<const Prompt*> chosen;
  for (const Prompt& p : *prompts) {
    if (p.task != task || std::find(contexts.begin(), contexts.end(), p.context) == contexts.end() ||
        std::find(depths.begin(), depths.end(), p.depth) == depths.end() || used[{p.context, p.depth}] >= max_trials) {
      continue;
    }
    ++used[{p.context, p.depth}];
    // The last answer token is never fed back, so positions 0 .. ids + answer - 2 are used.
    const int64_t last_pos = static_cast<int64_t>(p.ids.size() + p.answer.size()) - 2;
    if (last_pos >= m.config().max_position) {
      std::fprintf(stderr,
                   "accuracy: %s: a %s prompt of context %d has %zu tokens + %zu answer tokens, reaching position "
                   "%lld; %s/config.json max_position_embeddings is %d\n",
                   prompts_path.c_str(), p.task.c_str(), p.context, p.ids.size(), p.answer.size(),
                   static_cast<long long>(last_pos), dir.c_str(), m.config().max_position);
      return 1;
    }
    chosen.push_back(&p);
  }
  if (chosen.empty()) {
    std::fprintf(stderr, "accuracy: no %s prompt in %s matches --contexts/--depths\n", task.c_str(),
                 prompts_path.c_str());
    return 1;
  }
  double prefill_wall = 0, prefill_cpu = 0;
  const double run_wall0 = WallSeconds(), run_cpu0 = ProcessCpuSeconds();
  for (const Prompt* pp : chosen) {
    const Prompt& p = *pp;
    const int64_t n = static_cast<int64_t>(p.ids.size()) - 1;
    const double pw0 = WallSeconds(), pc0 = ProcessCpuSeconds();
    std::vector<std::vector<float>> k(shape.num_layers), v(shape.num_layers);
    {
      model::DenseKvCache dense(shape);
      std::vector<float> logits;
      model::SequenceInput in{0, std::span<const int32_t>(p.ids.data(), n)};
      Status st = dense.AddSequence(0);
      if (st.ok()) st = m.Forward({&in, 1}, dense, model::LogitsMode::kLastToken, &logits);
      const size_t row = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
      for (int l = 0; l < shape.num_layers && st.ok(); ++l) {
        k[l].resize(n * row);
        v[l].resize(n * row);
        st = dense.ReadLayerKv(0, l, k[l].data(), v[l].data());
      }
      if (!st.ok()) {
        std::fprintf(stderr, "accuracy: prefill: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    const double pw = WallSeconds() - pw0, pc = ProcessCpuSeconds() - pc0;
    prefill_wall += pw;
    prefill_cpu += pc;
    kvstore::PagePoolOptions po;
    po.page_size = 16;
    po.head_dim = shape.head_dim;
    po.dtype = kernels::DType::kF32;
    // Tree leaves are not all full pages: room for 3x the dense page count.
    po.num_pages = 3 * (n / 16 + 4) * shape.num_layers * shape.num_kv_heads + 256;
    auto pool = kvstore::PagePool::Create(po);
    if (!pool.ok()) {
      std::fprintf(stderr, "accuracy: %s\n", pool.status().ToString().c_str());
      return 1;
    }
    const double mw0 = WallSeconds();
    std::string misses;
    for (size_t mi = 0; mi < methods.size(); ++mi) {
      auto r = RunTrial(m, pool->get(), k, v, n, p, methods[mi]);
      if (!r.ok()) {
        std::fprintf(stderr, "accuracy: %s: %s\n", Label(methods[mi]).c_str(), r.status().ToString().c_str());
        return 1;
      }
      Cell& c = cells[{static_cast<int>(mi), p.context, p.depth}];
      c.correct += r->correct ? 1 : 0;
      ++c.trials;
      c.fov = r->fov;
      c.seconds += r->seconds;
      if (!r->correct) misses += " [" + Label(methods[mi]) + "]";
    }
    std::fprintf(stderr, "accuracy: %s context %d (%lld tokens) depth %d: prefill %.1f s (cpu %.1f s), methods %.1f s; wrong:%s\n",
                 p.task.c_str(), p.context, static_cast<long long>(n), p.depth, pw, pc, WallSeconds() - mw0,
                 misses.empty() ? " none" : misses.c_str());
  }
  nlohmann::json results = nlohmann::json::array();
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    for (int c : contexts) {
      for (int d : depths) {
        auto it = cells.find({static_cast<int>(mi), c, d});
        if (it == cells.end()) continue;
        const Cell& cell = it->second;
        nlohmann::json r = {{"task", task}, {"context", c}, {"depth", d}, {"method", methods[mi].name}};
        if (methods[mi].budget > 0) r["budget"] = methods[mi].budget;
        if (methods[mi].fov_swept) {
          r["fov_min"] = methods[mi].dci.fov_min;
          r["fov_fraction"] = methods[mi].dci.fov_fraction;
          r["fov"] = cell.fov;
        }
        r["correct"] = cell.correct;
        r["accuracy"] = static_cast<double>(cell.correct) / cell.trials;
        r["trials"] = cell.trials;
        r["seconds"] = cell.seconds;
        results.push_back(r);
        if (!json) {
          const std::string fov = methods[mi].fov_swept ? " (fov " + std::to_string(cell.fov) + ")" : "";
          std::printf("%-40s context %5d  depth %3d  %d/%d  accuracy %.2f  %.1f s\n",
                      (Label(methods[mi]) + fov).c_str(), c, d, cell.correct, cell.trials,
                      r["accuracy"].get<double>(), cell.seconds);
        }
      }
    }
  }
  const double run_wall = WallSeconds() - run_wall0, run_cpu = ProcessCpuSeconds() - run_cpu0;
  if (json) {
    nlohmann::json out = {{"results", results},
                          {"prompts", chosen.size()},
                          {"prefill_seconds", prefill_wall},
                          {"prefill_cpu_seconds", prefill_cpu},
                          {"wall_seconds", run_wall},
                          {"cpu_seconds", run_cpu}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%zu prompts: wall %.1f s (prefill %.1f s), process cpu %.1f s (prefill %.1f s)\n", chosen.size(),
                run_wall, prefill_wall, run_cpu, prefill_cpu);
  }
  if (!plot.empty()) {
    Status st = WritePlot(plot, methods, contexts, depths, cells);
    if (!st.ok()) {
      std::fprintf(stderr, "accuracy: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("accuracy", "passkey/needle accuracy: full KV vs oracle vs IceCache vs window", RunAccuracy);

}  // namespace icecache::bench
