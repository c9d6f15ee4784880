// icecache-bench accuracy: passkey / needle retrieval accuracy of the project's own engine
// (model::Model) under different KV selections (bench/kv_methods.h: full, oracle, icecache,
// quest, window; budgets in pages of 16 tokens, sink and window included).
//
// Per prompt: prompt[0 .. n-2] is prefilled densely (model::DenseKvCache), its K/V are read back and
// built into a kvstore::SequenceCache in the method's layout. Then the last prompt token and the
// answer are decoded greedily under the method, so every answer token (the first included) is
// produced by the method's attention, through decode::IceCacheBackend (the decode worker's
// backend). Prompts come from a jsonl file (eval_prompts.jsonl of tools/train/passkey_lib.py:
// correct = the greedy ids equal the answer ids) or are generated for the model's tokenizer and
// chat template (bench/eval_prompts.h: correct = the greedy text starts with the answer).
// The DCI field of view (DciTree::FieldOfView() level-1 cells: max(fov_min, fov_fraction * n,
// fov_sqrt * sqrt(n)), n = tree tokens) can be
// swept: icecache runs once per (fov_min, fov_fraction) pair of the two lists, over the
// same prefill, so fov settings are compared on the same prompts in one run.

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

#include "bench/cpu_time.h"
#include "bench/eval_prompts.h"
#include "bench/kv_methods.h"
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

using Prompt = EvalPrompt;
using Method = KvMethod;

struct TrialResult {
  bool correct = false;
  int64_t fov = 0;        // level-1 cells the query expands at this prompt's tree size
  double seconds = 0;     // wall: cache/tree build + decode
  std::string text;       // generated prompts: the greedy continuation
};

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Greedy decode after feeding the last prompt token: jsonl prompts decode answer.size() tokens
// and compare ids; generated ones decode answer.size() + 2 tokens (or to an eos) and compare text.
StatusOr<bool> Decode(model::Model& m, model::AttentionBackend& be, const Prompt& p, std::string* got) {
  std::vector<float> logits;
  int32_t tok = p.ids.back();
  const int vocab = m.config().vocab_size;
  const tokenizer::Tokenizer* tk = m.tokenizer();
  const bool by_text = !p.answer_text.empty() && tk != nullptr;
  const size_t steps = by_text ? p.answer.size() + 2 : p.answer.size();
  std::vector<int32_t> out;
  const std::vector<int32_t> eos = tk != nullptr ? tk->eos_ids() : std::vector<int32_t>{};
  for (size_t i = 0; i < steps; ++i) {
    ICE_RETURN_IF_ERROR(DecodeStep(m, be, tok, &logits));
    tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    if (!by_text && tok != p.answer[i]) return false;
    if (by_text && std::find(eos.begin(), eos.end(), tok) != eos.end()) break;
    out.push_back(tok);
  }
  if (!by_text) return true;
  ICE_ASSIGN_OR_RETURN(*got, tk->Decode(out, /*skip_special_tokens=*/true));
  return AnswerMatches(*got, p.answer_text);
}

StatusOr<TrialResult> RunTrial(model::Model& m, kvstore::PagePool* pool, const PrefillKv& kv, const Prompt& p,
                               const Method& meth, const KvLayout& layout) {
  TrialResult r;
  const double t0 = WallSeconds();
  ICE_ASSIGN_OR_RETURN(auto be, ImportMethod(m, pool, kv, meth, layout, &r.fov));
  ICE_ASSIGN_OR_RETURN(r.correct, Decode(m, *be, p, &r.text));
  r.seconds = WallSeconds() - t0;
  return r;
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

std::string Label(const Method& m) { return MethodLabel(m); }

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
    "usage: icecache-bench accuracy --model DIR|FILE.gguf [--task passkey|needle]\n"
    "         [--prompts FILE.jsonl (default DIR/eval_prompts.jsonl when present, else generated)]\n"
    "         [--haystack FILE (needle: the real text the needle hides in; generated prompts)] [--seed S]\n"
    "         [--contexts 1k,2k,4k] [--depths 0,25,50,75,100] [--methods full,oracle,icecache,quest,window]\n"
    "         [--budget-pages 8,16 (pages of 16 tokens, sink and window included)]\n"
    "         [--sink-pages 2] [--window-pages 2] [--dense-layers 2] [--kv-dtype bf16|f16|f32] (serving defaults)\n"
    "         [--trials N (jsonl: max per cell; generated: prompts per cell, default 1)]\n"
    "         [--dci reference|tuned|flat (default: the serving preset, kvstore::kServingDciPreset)]\n"
    "         [--dci-fov-min N[,N..] (field of view minimum, >= 1)]\n"
    "         [--dci-fov-fraction F[,F..] (field of view per tree token, [0, 1]; 0: constant fov_min)]\n"
    "         [--dci-group-fov G (cap on a GQA group's cells, G x fov; 0: none; default: the preset's)]\n"
    "         [--ice-group G (ICE(r): G consecutive sparse layers share a selection; 1 = off)]\n"
    "         [--group-merge rank|mass[,..] (kvstore::GroupMerge of icecache, oracle and quest; a list runs\n"
    "         each; default: the serving merge)]\n"
    "         [--rest-estimate on|off[,..] (kvstore::RetrievalPolicy::estimate_rest of icecache and oracle; a list\n"
    "         runs each; default: the serving one)] [--rest-cells N[,N..] (RetrievalPolicy::rest_cells; as perplexity)]\n"
    "         [--json] [--plot FILE.png]\n"
    "methods (all through decode::IceCacheBackend), budget B pages, S sink, W window pages:\n"
    "  icecache  S sink + B-S-W DCI-tree leaves + W window   oracle  the same with the exact best leaves\n"
    "  quest     S sink + B-S-W pages in token order ranked by Quest's min/max bound + W window\n"
    "  window    S sink + B-S most recent pages               full    every page\n"
    "fov: icecache runs once per (fov_min, fov_fraction) pair of the two lists (default: the preset's);\n"
    "     the query expands DciTree::FieldOfView() = max(fov_min, ceil(fov_fraction * n), ceil(fov_sqrt * sqrt(n)))\n"
    "     level-1 cells, n = tree tokens (fov_sqrt: the preset's, 0 unless flat)\n";

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

int RunAccuracy(int argc, char** argv) {
  std::string dir, prompts_path, task = "passkey", plot, haystack_path, kv_dtype = "bf16";
  std::string contexts_s = "1k,2k,4k", depths_s = "0,25,50,75,100", methods_s = "full,oracle,icecache,quest,window",
              budgets_s = "8,16";
  int max_trials = -1;
  uint64_t seed = 1;
  bool json = false;
  KvLayout layout;
  auto preset = kvstore::DciParamsPreset(kvstore::kServingDciPreset);
  if (!preset.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", preset.status().ToString().c_str());
    return 1;
  }
  kvstore::DciParams dci = *preset;
  std::string fov_mins_s, fov_fractions_s;
  std::optional<double> group_fov;  // unset: the preset's
  int ice_group = 1;
  std::string merge_s, rest_s, rest_cells_s;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool has = i + 1 < argc;
    if (f == "--model" && has) dir = argv[++i];
    else if (f == "--prompts" && has) prompts_path = argv[++i];
    else if (f == "--haystack" && has) haystack_path = argv[++i];
    else if (f == "--seed" && has) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (f == "--task" && has) task = argv[++i];
    else if (f == "--contexts" && has) contexts_s = argv[++i];
    else if (f == "--depths" && has) depths_s = argv[++i];
    else if (f == "--methods" && has) methods_s = argv[++i];
    else if (f == "--budget-pages" && has) budgets_s = argv[++i];
    else if (f == "--sink-pages" && has) layout.sink_pages = std::atoi(argv[++i]);
    else if (f == "--window-pages" && has) layout.window_pages = std::atoi(argv[++i]);
    else if (f == "--dense-layers" && has) layout.dense_layers = std::atoi(argv[++i]);
    else if (f == "--kv-dtype" && has) kv_dtype = argv[++i];
    else if (f == "--trials" && has) max_trials = std::atoi(argv[++i]);
    else if (f == "--plot" && has) plot = argv[++i];
    else if (f == "--json") json = true;
    else if (f == "--dci" && has) {
      auto d = kvstore::DciParamsPreset(std::string(argv[i + 1]) == "default" ? "reference" : argv[i + 1]);
      if (!d.ok()) {
        std::fprintf(stderr, "accuracy: --dci: %s\n", d.status().message().c_str());
        return 2;
      }
      dci = *d;
      ++i;
    }
    else if (f == "--dci-fov-min" && has) fov_mins_s = argv[++i];
    else if (f == "--dci-fov-fraction" && has) fov_fractions_s = argv[++i];
    else if (f == "--dci-group-fov" && has) group_fov = std::atof(argv[++i]);
    else if (f == "--ice-group" && has) ice_group = std::atoi(argv[++i]);
    else if (f == "--group-merge" && has) merge_s = argv[++i];
    else if (f == "--rest-estimate" && has) rest_s = argv[++i];
    else if (f == "--rest-cells" && has) rest_cells_s = argv[++i];
    else {
      std::fprintf(stderr, "accuracy: bad argument '%s'%s\n%s", f.c_str(),
                   f == "--budgets" ? " (budgets are in pages of 16 tokens now: --budget-pages)" : "", kUsage);
      return 2;
    }
  }
  if (dir.empty() || max_trials == 0 || max_trials < -1 || ice_group < 1 || layout.sink_pages < 0 ||
      layout.window_pages < 0 || layout.dense_layers < 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  auto dtype = ParseKvDtype(kv_dtype);
  if (!dtype.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", dtype.status().message().c_str());
    return 2;
  }
  layout.dtype = *dtype;
  if (group_fov) dci.group_fov = *group_fov;  // out of range: refused by the sweep's validation
  auto sweep = FovSweep(dci, fov_mins_s, fov_fractions_s);
  if (!sweep.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", sweep.status().ToString().c_str());
    return 2;
  }
  std::vector<int> contexts, depths, budgets;
  for (auto& s : Split(contexts_s)) contexts.push_back(ParseContext(s));
  for (auto& s : Split(depths_s)) depths.push_back(std::atoi(s.c_str()));
  auto budgets_or = ParseIntList("--budget-pages", budgets_s);
  if (!budgets_or.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", budgets_or.status().message().c_str());
    return 2;
  }
  budgets = *budgets_or;
  auto merges = ParseGroupMerges(merge_s);
  if (!merges.ok()) {
    std::fprintf(stderr, "accuracy: --group-merge: %s\n", merges.status().message().c_str());
    return 2;
  }
  auto rests = ParseRestVariants(rest_s, rest_cells_s);
  if (!rests.ok()) {
    std::fprintf(stderr, "accuracy: --rest-estimate: %s\n", rests.status().message().c_str());
    return 2;
  }
  std::vector<Method> methods;
  for (auto& name : Split(methods_s)) {
    if (name == "full") {
      methods.push_back({name, 0, dci, ice_group, false});
      continue;
    }
    for (int b : budgets) {
      const size_t nr = TreeMethod(name) ? rests->size() : 1;
      for (size_t mi = 0; mi < (name == "window" ? 1 : merges->size() * nr); ++mi) {
        const kvstore::GroupMerge merge = (*merges)[mi / nr];
        const auto rest = TreeMethod(name) ? (*rests)[mi % nr] : std::pair<bool, int>{false, 0};
        if (name == "icecache") {
          for (const kvstore::DciParams& d : *sweep)
            methods.push_back({name, b, d, ice_group, true, merge, rest.first, rest.second});
        } else {
          methods.push_back({name, b, dci, name == "quest" ? 1 : ice_group, false, merge, rest.first, rest.second});
        }
        Status st = ValidateKvMethod(methods.back(), layout);
        if (!st.ok()) {
          std::fprintf(stderr, "accuracy: %s\n", st.message().c_str());
          return 2;
        }
      }
    }
  }
  auto model = model::Model::Load(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", model.status().ToString().c_str());
    return 1;
  }
  model::Model& m = **model;
  if (prompts_path.empty() && std::ifstream(dir + "/eval_prompts.jsonl").good()) prompts_path = dir + "/eval_prompts.jsonl";
  StatusOr<std::vector<Prompt>> prompts = std::vector<Prompt>{};
  std::string source;
  if (!prompts_path.empty()) {
    prompts = LoadEvalPrompts(prompts_path);
    source = prompts_path;
  } else if (m.tokenizer() == nullptr) {
    prompts = FailedPreconditionError(dir + " has no tokenizer and no eval_prompts.jsonl: pass --prompts FILE.jsonl");
  } else {
    std::string haystack;
    if (task == "needle" && (haystack_path.empty() || !ReadFile(haystack_path, &haystack))) {
      std::fprintf(stderr, "accuracy: needle prompts are generated from real text: --haystack FILE (%s)\n",
                   haystack_path.empty() ? "missing" : ("cannot read " + haystack_path).c_str());
      return 2;
    }
    prompts = MakeEvalPrompts(*m.tokenizer(), task, haystack, contexts, depths, std::max(max_trials, 1), seed);
    source = "generated";
  }
  if (!prompts.ok()) {
    std::fprintf(stderr, "accuracy: %s\n", prompts.status().ToString().c_str());
    return 1;
  }
  if (max_trials < 0) max_trials = 1 << 30;
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
    const int64_t last_pos = static_cast<int64_t>(p.ids.size() + p.answer.size()) - 2 + (p.answer_text.empty() ? 0 : 2);
    if (last_pos >= m.config().max_position) {
      std::fprintf(stderr,
                   "accuracy: %s: a %s prompt of context %d has %zu tokens + %zu answer tokens, reaching position "
                   "%lld; the model's max_position_embeddings is %d\n",
                   source.c_str(), p.task.c_str(), p.context, p.ids.size(), p.answer.size(),
                   static_cast<long long>(last_pos), m.config().max_position);
      return 1;
    }
    chosen.push_back(&p);
  }
  if (chosen.empty()) {
    std::fprintf(stderr, "accuracy: no %s prompt in %s matches --contexts/--depths\n", task.c_str(), source.c_str());
    return 1;
  }
  double prefill_wall = 0, prefill_cpu = 0;
  const double run_wall0 = WallSeconds(), run_cpu0 = ProcessCpuSeconds();
  for (const Prompt* pp : chosen) {
    const Prompt& p = *pp;
    const int64_t n = static_cast<int64_t>(p.ids.size()) - 1;
    const double pw0 = WallSeconds(), pc0 = ProcessCpuSeconds();
    auto kv = PrefillDense(m, std::span<const int32_t>(p.ids.data(), n));
    if (!kv.ok()) {
      std::fprintf(stderr, "accuracy: prefill: %s\n", kv.status().ToString().c_str());
      return 1;
    }
    const double pw = WallSeconds() - pw0, pc = ProcessCpuSeconds() - pc0;
    prefill_wall += pw;
    prefill_cpu += pc;
    auto pool = MakeMethodPool(shape, layout, n + 64);
    if (!pool.ok()) {
      std::fprintf(stderr, "accuracy: %s\n", pool.status().ToString().c_str());
      return 1;
    }
    const double mw0 = WallSeconds();
    std::string misses;
    for (size_t mi = 0; mi < methods.size(); ++mi) {
      auto r = RunTrial(m, pool->get(), *kv, p, methods[mi], layout);
      if (!r.ok()) {
        std::fprintf(stderr, "accuracy: %s: %s\n", Label(methods[mi]).c_str(), r.status().ToString().c_str());
        return 1;
      }
      Cell& c = cells[{static_cast<int>(mi), p.context, p.depth}];
      c.correct += r->correct ? 1 : 0;
      ++c.trials;
      c.fov = r->fov;
      c.seconds += r->seconds;
      if (!r->correct) misses += " [" + Label(methods[mi]) + (r->text.empty() ? "" : ": '" + r->text + "'") + "]";
    }
    std::fprintf(stderr, "accuracy: %s context %d (%lld tokens) depth %d%s: prefill %.1f s (cpu %.1f s), methods %.1f s; wrong:%s\n",
                 p.task.c_str(), p.context, static_cast<long long>(n), p.depth,
                 p.answer_text.empty() ? "" : (", answer '" + p.answer_text + "'").c_str(), pw, pc, WallSeconds() - mw0,
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
        if (methods[mi].name != "full") r["budget_pages"] = methods[mi].budget_pages;
        if (methods[mi].name != "full" && methods[mi].name != "window")
          r["group_merge"] = kvstore::GroupMergeName(methods[mi].merge);
        if (TreeMethod(methods[mi].name)) r["rest_estimate"] = methods[mi].estimate_rest;
        if (TreeMethod(methods[mi].name) && methods[mi].estimate_rest) r["rest_cells"] = methods[mi].rest_cells;
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
