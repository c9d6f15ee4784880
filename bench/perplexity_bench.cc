// icecache-bench perplexity: teacher-forced perplexity of the last E tokens of a long real text
// under each KV selection method (bench/kv_methods.h), as a ratio to full KV.
//
// The text is tokenized with the model's tokenizer (bos added where it asks) and cut to --context
// tokens (its first ones). Tokens [0, N-E-1) are prefilled densely; then tokens N-E-1 .. N-2 are fed
// one at a time through decode::IceCacheBackend under the method, each predicting the next, so all
// E targets (the last E tokens) are scored under the method's attention; the cache grows as in
// serving (the window slides, evicted window pages join the tree or, for quest, the middle pages).
// perplexity = exp(mean negative log-likelihood of the E targets).
#include <algorithm>
#include <numeric>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/kv_methods.h"
#include "bench/workload.h"
#include "kvstore/dci_tree.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::bench {
namespace {

constexpr const char* kUsage =
    "usage: icecache-bench perplexity --model DIR|FILE.gguf --text FILE [--context 8192] [--eval-tokens 512]\n"
    "         [--methods full,icecache,quest,window,oracle] [--budget-pages 16 (pages of 16 tokens, sink and window\n"
    "         included; a list runs each)] [--sink-pages 2] [--window-pages 2] [--dense-layers 2] [--kv-dtype bf16]\n"
    "         [--page-size 16 (tokens a page; sink, window and budget count pages of this size)]\n"
    "         [--dci reference|tuned|flat (default: the serving preset)] [--dci-seed S[,S..] (DciParams::seed:\n"
    "         the trees' random level sampling; icecache and oracle run once per seed, and the seeds' mean,\n"
    "         min and max ratio are reported, since one tree's ratio moves by 0.01-0.02 with its seed)]\n"
    "         [--group-merge rank|mass[,..] (kvstore::GroupMerge: how a GQA group's lists become one page set;\n"
    "         a list runs each; default: the serving merge)]\n"
    "         [--rest-estimate on|off[,..] (kvstore::RetrievalPolicy::estimate_rest of icecache and oracle: the\n"
    "         leaves left out estimated from their mean keys and values; a list runs each; default: the serving one)]\n"
    "         [--rest-cells N[,N..] (RetrievalPolicy::rest_cells with the estimate on: cells estimated leaf by leaf,\n"
    "         the others as one group each; 0 = every leaf; a list runs each; default: the serving one)]\n"
    "         [--ice-group G (ICE(r): G consecutive sparse layers share a selection; 1 = off)]\n"
    "         [--gguf-weights keep|bf16 (a GGUF's Q8_0/Q4 blocks kept, the default, or dequantised at load)] [--json]\n"
    "methods and budget accounting: as icecache-bench accuracy (bench/kv_methods.h)\n";

double Wall() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// -log softmax(logits)[target], in double.
double Nll(const std::vector<float>& logits, int vocab, int32_t target) {
  double mx = -1e300;
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  return -(static_cast<double>(logits[target]) - mx - std::log(z));
}

int RunPerplexity(int argc, char** argv) {
  std::string dir, text_path, methods_s = "full,icecache,quest,window", budgets_s = "16", kv_dtype = "bf16";
  model::GgufWeights gguf_weights = model::GgufWeights::kKeep;
  int context = 8192, eval_tokens = 512, ice_group = 1;
  bool json = false;
  KvLayout layout;
  auto dci = kvstore::DciParamsPreset(kvstore::kServingDciPreset);
  std::string seed_s, merge_s, rest_s, rest_cells_s;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool has = i + 1 < argc;
    if (f == "--model" && has) dir = argv[++i];
    else if (f == "--text" && has) text_path = argv[++i];
    else if (f == "--gguf-weights" && has) {
      auto w = model::ParseGgufWeights(argv[++i]);
      if (!w.ok()) {
        std::fprintf(stderr, "perplexity: %s\n", w.status().ToString().c_str());
        return 2;
      }
      gguf_weights = *w;
    }
    else if (f == "--context" && has) context = std::atoi(argv[++i]);
    else if (f == "--eval-tokens" && has) eval_tokens = std::atoi(argv[++i]);
    else if (f == "--methods" && has) methods_s = argv[++i];
    else if (f == "--budget-pages" && has) budgets_s = argv[++i];
    else if (f == "--sink-pages" && has) layout.sink_pages = std::atoi(argv[++i]);
    else if (f == "--window-pages" && has) layout.window_pages = std::atoi(argv[++i]);
    else if (f == "--dense-layers" && has) layout.dense_layers = std::atoi(argv[++i]);
    else if (f == "--page-size" && has) layout.page_size = std::atoi(argv[++i]);
    else if (f == "--kv-dtype" && has) kv_dtype = argv[++i];
    else if (f == "--dci" && has) dci = kvstore::DciParamsPreset(argv[++i]);
    else if (f == "--dci-seed" && has) seed_s = argv[++i];
    else if (f == "--group-merge" && has) merge_s = argv[++i];
    else if (f == "--rest-estimate" && has) rest_s = argv[++i];
    else if (f == "--rest-cells" && has) rest_cells_s = argv[++i];
    else if (f == "--ice-group" && has) ice_group = std::atoi(argv[++i]);
    else if (f == "--json") json = true;
    else {
      std::fprintf(stderr, "perplexity: bad argument '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty() || text_path.empty() || eval_tokens < 1 || context < eval_tokens + 2 || ice_group < 1) {
    std::fprintf(stderr, "perplexity: --model and --text are required; --context must exceed --eval-tokens + 1\n%s", kUsage);
    return 2;
  }
  if (!dci.ok()) {
    std::fprintf(stderr, "perplexity: --dci: %s\n", dci.status().message().c_str());
    return 2;
  }
  std::vector<uint64_t> seeds;  // empty: the preset's seed, one run per tree method
  for (const std::string& v : Split(seed_s)) {
    char* end = nullptr;
    seeds.push_back(std::strtoull(v.c_str(), &end, 0));
    if (v.empty() || *end != '\0') {
      std::fprintf(stderr, "perplexity: --dci-seed takes integers separated by commas, got '%s'\n", seed_s.c_str());
      return 2;
    }
  }
  auto merges_or = ParseGroupMerges(merge_s);
  if (!merges_or.ok()) {
    std::fprintf(stderr, "perplexity: --group-merge: %s\n", merges_or.status().message().c_str());
    return 2;
  }
  const std::vector<kvstore::GroupMerge> merges = *merges_or;
  auto rests_or = ParseRestVariants(rest_s, rest_cells_s);
  if (!rests_or.ok()) {
    std::fprintf(stderr, "perplexity: --rest-estimate: %s\n", rests_or.status().message().c_str());
    return 2;
  }
  const std::vector<std::pair<bool, int>> rests = *rests_or;
  auto dtype = ParseKvDtype(kv_dtype);
  if (!dtype.ok()) {
    std::fprintf(stderr, "perplexity: %s\n", dtype.status().message().c_str());
    return 2;
  }
  layout.dtype = *dtype;
  std::vector<KvMethod> methods;
  for (const std::string& name : Split(methods_s)) {
    if (name == "full") {
      methods.push_back({name, 0, *dci, ice_group, false});
      continue;
    }
    for (const std::string& b : Split(budgets_s)) {
      // window retrieves nothing, so the merge does not apply to it.
      for (size_t mi = 0; mi < (name == "window" ? 1 : merges.size() * (TreeMethod(name) ? rests.size() : 1)); ++mi) {
        const kvstore::GroupMerge merge = merges[TreeMethod(name) ? mi / rests.size() : mi];
        const auto rest = TreeMethod(name) ? rests[mi % rests.size()] : std::pair<bool, int>{false, 0};
        methods.push_back({name, std::atoi(b.c_str()), *dci, name == "quest" ? 1 : ice_group, false, merge, rest.first,
                           rest.second});
        Status st = ValidateKvMethod(methods.back(), layout);
        if (!st.ok()) {
          std::fprintf(stderr, "perplexity: %s\n", st.message().c_str());
          return 2;
        }
        if (!TreeMethod(name) || seeds.empty()) continue;
        const KvMethod base = methods.back();
        methods.pop_back();
        for (uint64_t seed : seeds) {
          methods.push_back(base);
          methods.back().dci.seed = seed;
        }
      }
    }
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "perplexity: cannot read %s\n", text_path.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  model::ModelLoadOptions load_options;
  load_options.gguf_weights = gguf_weights;
  auto model = model::Model::Load(dir, load_options);
  if (!model.ok()) {
    std::fprintf(stderr, "perplexity: %s\n", model.status().ToString().c_str());
    return 1;
  }
  model::Model& m = **model;
  if (m.tokenizer() == nullptr) {
    std::fprintf(stderr, "perplexity: %s has no tokenizer\n", dir.c_str());
    return 1;
  }
  auto ids = m.tokenizer()->Encode(ss.str(), /*add_special_tokens=*/true);
  if (!ids.ok()) {
    std::fprintf(stderr, "perplexity: %s\n", ids.status().ToString().c_str());
    return 1;
  }
  if (static_cast<int>(ids->size()) < context) {
    std::fprintf(stderr, "perplexity: %s has %zu tokens, fewer than --context %d\n", text_path.c_str(), ids->size(), context);
    return 1;
  }
  if (context > m.config().max_position) {
    std::fprintf(stderr, "perplexity: --context %d exceeds the model's max_position_embeddings %d\n", context,
                 m.config().max_position);
    return 1;
  }
  ids->resize(context);
  const int64_t n = context - eval_tokens - 1;
  const double p0 = Wall();
  auto kv = PrefillDense(m, std::span<const int32_t>(ids->data(), n));
  if (!kv.ok()) {
    std::fprintf(stderr, "perplexity: prefill: %s\n", kv.status().ToString().c_str());
    return 1;
  }
  const double prefill_s = Wall() - p0;
  std::fprintf(stderr, "perplexity: %s: %d tokens, prefilled %lld in %.1f s; scoring the last %d\n", text_path.c_str(),
               context, static_cast<long long>(n), prefill_s, eval_tokens);
  const int vocab = m.config().vocab_size;
  nlohmann::json rows = nlohmann::json::array();
  double full_ppl = 0;
  for (const KvMethod& meth : methods) {
    auto pool = MakeMethodPool(m.attention_shape(), layout, context + 64);
    if (!pool.ok()) {
      std::fprintf(stderr, "perplexity: %s\n", pool.status().ToString().c_str());
      return 1;
    }
    const double t0 = Wall();
    auto be = ImportMethod(m, pool->get(), *kv, meth, layout);
    if (!be.ok()) {
      std::fprintf(stderr, "perplexity: %s: %s\n", MethodLabel(meth).c_str(), be.status().ToString().c_str());
      return 1;
    }
    double nll = 0;
    std::vector<float> logits;
    for (int64_t t = n; t < context - 1; ++t) {
      Status st = DecodeStep(m, **be, (*ids)[t], &logits);
      if (!st.ok()) {
        std::fprintf(stderr, "perplexity: %s at token %lld: %s\n", MethodLabel(meth).c_str(), static_cast<long long>(t),
                     st.ToString().c_str());
        return 1;
      }
      nll += Nll(logits, vocab, (*ids)[t + 1]);
    }
    const double ppl = std::exp(nll / eval_tokens);
    if (meth.name == "full") full_ppl = ppl;
    nlohmann::json r = {{"method", meth.name}, {"perplexity", ppl}, {"seconds", Wall() - t0}};
    if (meth.name != "full") r["budget_pages"] = meth.budget_pages;
    if (meth.name != "full" && meth.name != "window") r["group_merge"] = kvstore::GroupMergeName(meth.merge);
    if (TreeMethod(meth.name)) r["rest_estimate"] = meth.estimate_rest;
    if (TreeMethod(meth.name) && meth.estimate_rest) r["rest_cells"] = meth.rest_cells;
    if (TreeMethod(meth.name) && !seeds.empty()) r["dci_seed"] = meth.dci.seed;
    r["ice_group"] = meth.ice_group;
    rows.push_back(r);
    std::fprintf(stderr, "perplexity: %-16s %.4f (%.1f s)\n", MethodLabel(meth).c_str(), ppl, Wall() - t0);
  }
  for (auto& r : rows) {
    if (full_ppl > 0) r["ratio_to_full"] = r["perplexity"].get<double>() / full_ppl;
  }
  // Per tree method and budget, over the seeds: mean, min and max perplexity (and ratio).
  nlohmann::json over_seeds = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (!r.contains("dci_seed") || r["dci_seed"].get<uint64_t>() != seeds.front()) continue;
    std::vector<double> ppl;
    for (size_t j = i; j < rows.size() && ppl.size() < seeds.size(); ++j) ppl.push_back(rows[j]["perplexity"].get<double>());
    const double mean = std::accumulate(ppl.begin(), ppl.end(), 0.0) / static_cast<double>(ppl.size());
    nlohmann::json s = {{"method", r["method"]}, {"budget_pages", r["budget_pages"]}, {"group_merge", r["group_merge"]},
                        {"rest_estimate", r["rest_estimate"]}, {"seeds", ppl.size()},
                        {"rest_cells", r.contains("rest_cells") ? r["rest_cells"] : nlohmann::json()},
                        {"perplexity_mean", mean}, {"perplexity_min", *std::min_element(ppl.begin(), ppl.end())},
                        {"perplexity_max", *std::max_element(ppl.begin(), ppl.end())}};
    if (full_ppl > 0)
      for (const char* k : {"mean", "min", "max"}) s[std::string("ratio_") + k] = s[std::string("perplexity_") + k].get<double>() / full_ppl;
    over_seeds.push_back(s);
  }
  if (json) {
    nlohmann::json out = {{"workload", "perplexity"}, {"text", text_path}, {"context", context},
                          {"eval_tokens", eval_tokens}, {"page_size", layout.page_size},
                          {"sink_pages", layout.sink_pages}, {"window_pages", layout.window_pages},
                          {"dense_layers", layout.dense_layers}, {"prefill_seconds", prefill_s}, {"results", rows}};
    if (!over_seeds.empty()) out["over_seeds"] = over_seeds;
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("perplexity of the last %d of %d tokens of %s\n", eval_tokens, context, text_path.c_str());
    for (const auto& r : rows) {
      std::printf("  %-10s %-4s %-4s %-8s ppl %.4f  ratio to full %s  %.1f s%s\n", r["method"].get<std::string>().c_str(),
                  r.contains("budget_pages") ? ("b" + std::to_string(r["budget_pages"].get<int>())).c_str() : "",
                  r.contains("group_merge") ? r["group_merge"].get<std::string>().c_str() : "",
                  r.contains("rest_estimate") ? (r["rest_estimate"].get<bool>() ? "rest on" : "rest off") : "",
                  r["perplexity"].get<double>(),
                  r.contains("ratio_to_full") ? std::to_string(r["ratio_to_full"].get<double>()).c_str() : "-",
                  r["seconds"].get<double>(),
                  r.contains("dci_seed") ? ("  tree seed " + std::to_string(r["dci_seed"].get<uint64_t>())).c_str() : "");
    }
    for (const auto& s : over_seeds)
      std::printf("  %-10s b%-3d %-4s %-8s over %d tree seeds: ppl mean %.4f (min %.4f, max %.4f)\n",
                  s["method"].get<std::string>().c_str(), s["budget_pages"].get<int>(),
                  s["group_merge"].get<std::string>().c_str(), s["rest_estimate"].get<bool>() ? "rest on" : "rest off",
                  s["seeds"].get<int>(), s["perplexity_mean"].get<double>(),
                  s["perplexity_min"].get<double>(), s["perplexity_max"].get<double>());
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("perplexity", "teacher-forced perplexity of a long text's last tokens per KV method, ratio to full",
                   RunPerplexity);

}  // namespace icecache::bench
