// icecache-bench cluster: measurements of the disaggregated path on loopback, each against a
// baseline from the same run.
//   ttft      TTFT and its breakdown (prefill queue, compute, tree build, transfer) per prompt size
//   tpot      TPOT vs context for budget full and budget 16 (ratio sparse / full)
//   router    time per token through the router vs streaming straight from the decode worker
//   ucx       UCX page shipping GB/s vs memcpy GB/s of the same bytes
// Everything runs in this process: real gRPC servers on 127.0.0.1 and real UCX between them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cpu_time.h"
#include "bench/callgrind_region.h"
#include "bench/workload.h"
#include "decode_worker/decode_server.h"
#include "kvstore/dci_tree.h"
#include "kvstore/page_pool.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "model/random_checkpoint.h"
#include "prefill_worker/prefill_server.h"
#include "serving/grpc_util.h"
#include "client/client.h"
#include "router/router_server.h"
#include "transport/transport.h"

namespace icecache::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Options {
  std::vector<int> ttft_prompts = {256, 1024, 4096};
  std::vector<int> contexts = {4096, 8192, 16384};
  int decode_tokens = 32;
  int hidden = 256, layers = 4, heads = 4, kv_heads = 2;
  int head_dim = 0, intermediate = 0;  // 0: the random checkpoint's defaults (hidden / heads, 8/3 hidden)
  std::string parts = "ttft,tpot,router,ucx";
  bool json = false;
  std::string tls = "tcp,sm,self";
  std::string kv_dtype = "bf16";
  bool ttft_baseline = true;  // ttft: also run the earlier shipping (f32, page segments, build after)
  int ttft_repeats = 3;       // ttft: medians over this many runs of each case
  bool overlap = true;        // prefill.overlap_tree_build of this build's cluster
  int dense_layers = 2;       // tpot/router: cache.dense_layers
  int budget_pages = 16;      // tpot: the sparse budget compared with full
  int router_repeats = 5;     // router: alternating runs of each path, medians
  std::string dci_preset = "tuned";  // cache.dci_preset of the cluster (reference | tuned | flat)
  double dci_group_fov = 0;          // cache.dci_group_fov (0: the preset's)
  bool tpot_full = true;      // tpot: also run budget full at each context (--no-tpot-full: the sparse budget only)
  int prefill_tp = 1, decode_tp = 1;  // parallel.tensor_parallel_size of the workers (docs/parallel.md)
};

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::atoi(item.c_str()));
  return v;
}

struct Cluster {
  std::unique_ptr<prefill::PrefillServer> prefill;
  std::unique_ptr<decode::DecodeServer> decode;
  std::unique_ptr<router::RouterServer> router;
  cluster::ClusterConfig config;
};

// old_shipping: the shipping before issue #5 (f32 pages, one page per segment, trees built after
// the forward pass), the baseline of the ttft part.
StatusOr<std::unique_ptr<Cluster>> StartCluster(const Options& o, const std::string& dir, int max_context,
                                                bool old_shipping = false) {
  auto c = std::make_unique<Cluster>();
  auto& cfg = c->config;
  cfg.model.dir = dir;
  cfg.cache.page_size = 16;
  cfg.cache.dense_layers = o.dense_layers;
  cfg.cache.dci_preset = o.dci_preset;
  cfg.cache.dci_group_fov = o.dci_group_fov;
  cfg.cache.kv_dtype = old_shipping ? "f32" : o.kv_dtype;
  cfg.prefill.overlap_tree_build = !old_shipping && o.overlap;
  if (old_shipping) cfg.ucx.max_segment_bytes = 1;
  cfg.limits.max_tokens = 4096;
  cfg.limits.max_prompt_tokens = max_context + 1;
  cfg.router.listen = cfg.prefill.listen = cfg.decode.listen = "127.0.0.1:0";
  cfg.router.stats_refresh_seconds = 0.05;
  cfg.router.kv_transfer_timeout_seconds = 600;
  cfg.router.request_timeout_seconds = 7200;  // a 64k prefill of a larger model takes > 10 min on a small CPU
  cfg.ucx.transfer_timeout_seconds = 600;
  cfg.ucx.tls = o.tls;
  cfg.ucx.net_devices = "lo";
  cfg.prefill.max_batch_tokens = max_context + 1;
  // Full attention reserves every token's page in every (layer, kv head), +25 % for trees.
  cfg.decode.pool_pages = static_cast<int64_t>(o.layers) * o.kv_heads * ((max_context + 4096) / 16 + 8) * 2;
  cfg.parallel.tensor_parallel_size = o.prefill_tp;
  ICE_ASSIGN_OR_RETURN(c->prefill, prefill::PrefillServer::Start(cfg));
  cfg.parallel.tensor_parallel_size = o.decode_tp;
  ICE_ASSIGN_OR_RETURN(c->decode, decode::DecodeServer::Start(cfg));
  cfg.router.prefill.addresses = {c->prefill->address()};
  cfg.router.decode.addresses = {c->decode->address()};
  ICE_ASSIGN_OR_RETURN(c->router, router::RouterServer::Start(cfg));
  return c;
}

std::vector<int32_t> Prompt(int n) {
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % 500);
  return v;
}

// One generation's last chunk plus the decode phase measured here: wall and process CPU time per
// token from the first streamed token to the last. Everything (router, workers, client) runs in
// this process and nothing else is in flight, so the CPU time is the cluster's work per token,
// whatever else the machine runs.
struct Generated {
  router::RemoteChunk last;
  double wall_per_token = 0, cpu_per_token = 0;
};

// `callgrind_label`: the decode phase (from the first streamed token to the end of the stream) is a
// callgrind region of that name (bench/callgrind_region.h); nullptr: not marked.
StatusOr<Generated> GenerateOnce(const std::string& router, int prompt, int max_tokens, int budget,
                                 const char* callgrind_label = nullptr) {
  router::RemoteGenerateOptions g;
  g.router = router;
  g.prompt_ids = Prompt(prompt);
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  g.budget_pages = budget;
  Generated out;
  int tokens = 0;
  Clock::time_point first{};
  double cpu_first = 0;
  ICE_RETURN_IF_ERROR(router::RunRemoteGenerate(g, [&](const router::RemoteChunk& c) {
    if (tokens == 0 && !c.token_ids.empty()) {
      first = Clock::now();
      cpu_first = ProcessCpuSeconds();
      if (callgrind_label != nullptr) CallgrindBegin();
    }
    tokens += static_cast<int>(c.token_ids.size());
    if (c.last) out.last = c;
    return true;
  }));
  if (callgrind_label != nullptr && tokens > 0) CallgrindEnd(callgrind_label);
  if (tokens > 1) {
    out.wall_per_token = Since(first) / (tokens - 1);
    out.cpu_per_token = (ProcessCpuSeconds() - cpu_first) / (tokens - 1);
  }
  return out;
}

// Reserve -> Prefill -> Decode with the worker stubs directly; wall and process CPU seconds per
// decoded token (after the first streamed message).
StatusOr<Generated> DirectTpot(Cluster& c, int prompt, int max_tokens) {
  namespace pb = ::icecache::v1;
  auto dstub = pb::DecodeWorker::NewStub(cluster::MakeChannel(c.decode->address()));
  auto pstub = pb::PrefillWorker::NewStub(cluster::MakeChannel(c.prefill->address()));
  pb::ReserveRequest rr;
  rr.set_prompt_tokens(prompt);
  rr.set_max_tokens(max_tokens);
  rr.mutable_cache()->set_full(true);
  pb::ReserveResponse reserved;
  {
    grpc::ClientContext ctx;
    ICE_RETURN_IF_ERROR(cluster::FromGrpc(dstub->Reserve(&ctx, rr, &reserved)));
  }
  pb::PrefillRequest pr;
  auto ids = Prompt(prompt);
  pr.mutable_token_ids()->Add(ids.begin(), ids.end());
  pr.set_sequence_id(reserved.sequence_id());
  pr.set_decode_transport_address(reserved.transport_address());
  pr.set_reservation_token(reserved.reservation_token());
  pb::PrefillResponse prefilled;
  {
    grpc::ClientContext ctx;
    ICE_RETURN_IF_ERROR(cluster::FromGrpc(pstub->Prefill(&ctx, pr, &prefilled)));
  }
  pb::DecodeRequest dr;
  dr.set_sequence_id(reserved.sequence_id());
  dr.set_reservation_token(reserved.reservation_token());
  dr.set_first_token(prefilled.first_token());
  dr.set_max_tokens(max_tokens);
  dr.set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = dstub->Decode(&ctx, dr);
  pb::DecodeResponse resp;
  int tokens = 0;
  Clock::time_point first{};
  double cpu_first = 0;
  while (reader->Read(&resp)) {
    if (tokens == 0 && resp.token_ids_size() > 0) {
      first = Clock::now();
      cpu_first = ProcessCpuSeconds();
    }
    tokens += resp.token_ids_size();
  }
  ICE_RETURN_IF_ERROR(cluster::FromGrpc(reader->Finish()));
  Generated out;
  if (tokens > 1) {
    out.wall_per_token = Since(first) / (tokens - 1);
    out.cpu_per_token = (ProcessCpuSeconds() - cpu_first) / (tokens - 1);
  }
  return out;
}

int RunCluster(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--json") o.json = true;
    else if (a == "--parts") o.parts = next();
    else if (a == "--ttft-prompts") o.ttft_prompts = ParseInts(next());
    else if (a == "--ttft-repeats") o.ttft_repeats = std::max(1, std::atoi(next().c_str()));
    else if (a == "--contexts") o.contexts = ParseInts(next());
    else if (a == "--decode-tokens") o.decode_tokens = std::atoi(next().c_str());
    else if (a == "--hidden") o.hidden = std::atoi(next().c_str());
    else if (a == "--layers") o.layers = std::atoi(next().c_str());
    else if (a == "--heads") o.heads = std::atoi(next().c_str());
    else if (a == "--kv-heads") o.kv_heads = std::atoi(next().c_str());
    else if (a == "--head-dim") o.head_dim = std::atoi(next().c_str());
    else if (a == "--intermediate") o.intermediate = std::atoi(next().c_str());
    else if (a == "--tls") o.tls = next();
    else if (a == "--kv-dtype") o.kv_dtype = next();
    else if (a == "--no-ttft-baseline") o.ttft_baseline = false;
    else if (a == "--no-overlap") o.overlap = false;
    else if (a == "--dense-layers") o.dense_layers = std::atoi(next().c_str());
    else if (a == "--budget-pages") o.budget_pages = std::atoi(next().c_str());
    else if (a == "--router-repeats") o.router_repeats = std::max(1, std::atoi(next().c_str()));
    else if (a == "--no-tpot-full") o.tpot_full = false;
    else if (a == "--dci-preset") o.dci_preset = next();
    else if (a == "--dci-group-fov") o.dci_group_fov = std::atof(next().c_str());
    else if (a == "--prefill-tp") o.prefill_tp = std::max(1, std::atoi(next().c_str()));
    else if (a == "--decode-tp") o.decode_tp = std::max(1, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr,
                   "usage: icecache-bench cluster [--parts ttft,tpot,router,ucx] [--ttft-prompts 256,1024]\n"
                   "       [--contexts 4096,8192] [--decode-tokens N] [--hidden H] [--layers L] [--tls T] [--json]\n"
                   "       [--heads Q] [--kv-heads KV] [--head-dim D] [--intermediate I]\n"
                   "       [--kv-dtype bf16|f16|f32] [--no-ttft-baseline] [--ttft-repeats N]\n"
                   "       [--dense-layers N] [--budget-pages B] [--router-repeats R] [--no-tpot-full]\n"
                   "       [--dci-preset reference|tuned|flat] [--dci-group-fov G (0: the preset's)]\n"
                   "       [--prefill-tp N] [--decode-tp M] (the workers' tensor_parallel_size, CPU ranks)\n");
      return 2;
    }
  }
  {  // the tree parameters the prefill worker will use, checked before any cluster starts
    auto dci = kvstore::DciParamsPreset(o.dci_preset);
    Status st = dci.status();
    if (st.ok()) {
      if (o.dci_group_fov != 0) dci->group_fov = o.dci_group_fov;  // 0: the preset's
      st = kvstore::ValidateDciParams(*dci);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "cluster: --dci-preset / --dci-group-fov: %s\n", st.ToString().c_str());
      return 2;
    }
  }
  auto has = [&](const char* p) { return o.parts.find(p) != std::string::npos; };
  nlohmann::json out;
  out["model"] = {{"hidden", o.hidden},     {"layers", o.layers},         {"heads", o.heads},
                  {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim},     {"intermediate", o.intermediate}};
  out["dci_preset"] = o.dci_preset;
  out["dci_group_fov"] = o.dci_group_fov;
  out["dense_layers"] = o.dense_layers;
  out["prefill_tp"] = o.prefill_tp;
  out["decode_tp"] = o.decode_tp;

  if (has("ucx")) {
    auto rx = transport::CreateUcxTransport({o.tls, "lo"});
    auto tx = transport::CreateUcxTransport({o.tls, "lo"});
    if (!rx.ok() || !tx.ok()) {
      std::fprintf(stderr, "ucx: %s\n", (rx.ok() ? tx.status() : rx.status()).ToString().c_str());
      return 1;
    }
    // Page-sized segments (the old shipping: one f32 page of the bench model is 8 KiB, a bf16
    // page 4 KiB) against runs of pages coalesced into 4 MiB segments, received into one buffer
    // or scattered over shuffled 4 KiB pages (what the decode worker's KvReceiver does when its
    // pool is fragmented). The memcpy baseline copies the same pieces to the same places.
    struct UcxCase {
      const char* name;
      size_t segment, piece;  // piece < segment: the receiver scatters into shuffled pieces
    };
    const size_t total = size_t{256} << 20;
    // Both buffers are page pools as the workers allocate them (2 MiB aligned, transparent huge
    // pages advised), bf16 pages of the bench model (16 tokens x head_dim 64 x K,V = 4 KiB).
    kvstore::PagePoolOptions ppo;
    ppo.page_size = 16;
    ppo.head_dim = 64;
    ppo.dtype = kernels::DType::kBF16;
    ppo.num_pages = static_cast<int64_t>(total / 4096);
    ppo.zero_fill = true;
    auto src_pool = kvstore::PagePool::Create(ppo);
    auto dst_pool = kvstore::PagePool::Create(ppo);
    if (!src_pool.ok() || !dst_pool.ok()) {
      std::fprintf(stderr, "ucx: %s\n", (src_pool.ok() ? dst_pool.status() : src_pool.status()).ToString().c_str());
      return 1;
    }
    std::span<uint8_t> src(static_cast<uint8_t*>((*src_pool)->base()), total);
    std::span<uint8_t> dst(static_cast<uint8_t*>((*dst_pool)->base()), total);
    std::fill(src.begin(), src.end(), uint8_t{1});
    for (const UcxCase& uc : {UcxCase{"f32 page", 8 << 10, 8 << 10}, UcxCase{"bf16 page", 4 << 10, 4 << 10},
                              UcxCase{"1 MiB", 1 << 20, 1 << 20}, UcxCase{"coalesced 4 MiB", 4 << 20, 4 << 20},
                              UcxCase{"coalesced 4 MiB, scattered 4 KiB", 4 << 20, 4 << 10}}) {
      const size_t n = total / uc.segment;
      const size_t per = uc.segment / uc.piece;
      std::vector<size_t> place(total / uc.piece);  // piece i of the stream lands at piece place[i]
      for (size_t i = 0; i < place.size(); ++i) place[i] = i;
      if (per > 1) std::shuffle(place.begin(), place.end(), std::mt19937(1));
      std::vector<transport::Segment> segs;
      for (size_t i = 0; i < n; ++i) segs.push_back({static_cast<uint32_t>(i), src.data() + i * uc.segment, uc.segment});
      // The VM is shared: each repetition times UCX and then memcpy back to back, and the ratio
      // is the median of the per-repetition ratios (GB/s are medians too).
      std::vector<double> ucx_s, memcpy_s, ratios, cpu_s;
      const std::string token(transport::kTransferTokenBytes, 't');  // every message carries it
      for (int rep = 0; rep < 7; ++rep) {
        uint64_t id = rep + 1 + (uc.segment << 8) + (per << 40);
        (void)(*rx)->ExpectScatter(id, token, [&](uint32_t idx, size_t) -> StatusOr<std::vector<transport::Destination>> {
          std::vector<transport::Destination> d(per);
          for (size_t j = 0; j < per; ++j) d[j] = {dst.data() + place[idx * per + j] * uc.piece, uc.piece};
          return d;
        });
        auto t0 = Clock::now();
        const double cpu0 = ProcessCpuSeconds();
        auto deadline = t0 + std::chrono::seconds(60);
        Status s = (*tx)->Send((*rx)->address(), id, token, segs, deadline);
        if (s.ok()) s = (*tx)->Finish((*rx)->address(), id, token, static_cast<uint32_t>(n), deadline);
        if (s.ok()) s = (*rx)->Wait(id, deadline);
        if (!s.ok()) {
          std::fprintf(stderr, "ucx: %s\n", s.ToString().c_str());
          return 1;
        }
        ucx_s.push_back(Since(t0));
        cpu_s.push_back(ProcessCpuSeconds() - cpu0);
        t0 = Clock::now();
        for (size_t i = 0; i < place.size(); ++i) {
          std::memcpy(dst.data() + place[i] * uc.piece, src.data() + i * uc.piece, uc.piece);
        }
        memcpy_s.push_back(Since(t0));
        ratios.push_back(memcpy_s.back() / ucx_s.back());
      }
      const double ucx_gbs = total / Median(ucx_s) / 1e9, memcpy_gbs = total / Median(memcpy_s) / 1e9;
      const double ratio = Median(ratios), ucx_cpu = Median(cpu_s), ucx_wall = Median(ucx_s);
      out["ucx"].push_back({{"case", uc.name}, {"segment_bytes", uc.segment}, {"piece_bytes", uc.piece},
                            {"ucx_gb_s", ucx_gbs}, {"ucx_cpu_s", ucx_cpu}, {"memcpy_gb_s", memcpy_gbs},
                            {"ratio", ratio}});
      if (!o.json) {
        std::printf("ucx   %-34s %8zu-byte segments (%s): UCX %.2f GB/s (%.2f CPU s / %.3f s wall), memcpy %.2f GB/s, "
                    "ratio %.2f\n", uc.name, uc.segment, o.tls.c_str(), ucx_gbs, ucx_cpu, ucx_wall, memcpy_gbs, ratio);
      }
    }
  }

  int max_context = 0;
  for (int p : o.ttft_prompts) max_context = std::max(max_context, p);
  for (int p : o.contexts) max_context = std::max(max_context, p);
  std::string dir = std::filesystem::temp_directory_path().string() + "/icecache_bench_cluster_model";
  model::RandomModelSpec spec;
  spec.hidden = o.hidden;
  spec.layers = o.layers;
  spec.heads = o.heads;
  spec.kv_heads = o.kv_heads;
  spec.head_dim = o.head_dim;
  spec.intermediate = o.intermediate;
  spec.vocab = 512;
  spec.max_position = max_context + 4096;
  spec.write_tokenizer = false;
  if (Status s = model::WriteRandomCheckpoint(dir, spec); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  auto c = StartCluster(o, dir, max_context);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  const std::string router = (*c)->router->address();
  (void)GenerateOnce(router, 16, 2, 0);  // warm-up

  if (has("ttft")) {
    // Each prompt runs on the old shipping and on this build's, one after the other, so that both
    // see the same load. tree build = the part not hidden behind the forward pass (in TTFT);
    // build total and segments come from the prefill engine's counters.
    std::unique_ptr<Cluster> old;
    if (o.ttft_baseline) {
      auto oc = StartCluster(o, dir, max_context, /*old_shipping=*/true);
      if (!oc.ok()) {
        std::fprintf(stderr, "%s\n", oc.status().ToString().c_str());
        return 1;
      }
      old = std::move(*oc);
      (void)GenerateOnce(old->router->address(), 16, 2, 0);  // warm-up
    }
    struct Sample {
      std::vector<double> ttft, compute, build, build_total, transfer, cpu;
      int64_t bytes = 0, segments = 0;
    };
    for (int p : o.ttft_prompts) {
      for (int budget : {0, 16}) {
        std::map<Cluster*, Sample> samples;
        for (int rep = 0; rep < o.ttft_repeats; ++rep) {
          for (Cluster* cl : {old.get(), c->get()}) {
            if (cl == nullptr) continue;
            const auto before = cl->prefill->engine_stats();
            const double cpu0 = ProcessCpuSeconds();
            auto r = GenerateOnce(cl->router->address(), p, 2, budget);
            if (!r.ok()) {
              std::fprintf(stderr, "ttft: %s\n", r.status().ToString().c_str());
              return 1;
            }
            const auto after = cl->prefill->engine_stats();
            Sample& sm = samples[cl];
            sm.cpu.push_back(ProcessCpuSeconds() - cpu0);
            sm.ttft.push_back(r->last.ttft_seconds);
            sm.compute.push_back(r->last.prefill_compute_seconds);
            sm.build.push_back(r->last.tree_build_seconds);
            sm.build_total.push_back(after.tree_build_total_seconds - before.tree_build_total_seconds);
            sm.transfer.push_back(r->last.transfer_seconds);
            sm.bytes = r->last.transfer_bytes;
            sm.segments = after.segments_shipped - before.segments_shipped;
          }
        }
        for (Cluster* cl : {old.get(), c->get()}) {
          if (cl == nullptr) continue;
          const Sample& sm = samples[cl];
          const char* label = cl == old.get() ? "old" : "new";
          out["ttft"].push_back({{"prompt", p}, {"budget", budget}, {"shipping", label},
                                 {"kv_dtype", cl->config.cache.kv_dtype}, {"repeats", o.ttft_repeats},
                                 {"ttft_s", Median(sm.ttft)}, {"prefill_compute_s", Median(sm.compute)},
                                 {"tree_build_s", Median(sm.build)}, {"tree_build_total_s", Median(sm.build_total)},
                                 {"transfer_s", Median(sm.transfer)}, {"transfer_bytes", sm.bytes},
                                 {"segments", sm.segments}, {"process_cpu_s", Median(sm.cpu)}});
          if (!o.json) {
            std::printf("ttft  prompt %6d %-4s %s %-4s: TTFT %.3f s = compute %.3f + tree build %.4f (total %.4f) + "
                        "transfer %.4f (%.1f MB, %lld segments); process CPU %.3f s  [medians of %d]\n",
                        p, budget ? "b16" : "full", label, cl->config.cache.kv_dtype.c_str(), Median(sm.ttft),
                        Median(sm.compute), Median(sm.build), Median(sm.build_total), Median(sm.transfer),
                        sm.bytes / 1e6, static_cast<long long>(sm.segments), Median(sm.cpu), o.ttft_repeats);
          }
        }
      }
    }
  }
  if (has("tpot")) {
    // Decode-phase wall and CPU time per token, full attention vs the sparse budget, per context.
    for (int ctx : o.contexts) {
      StatusOr<Generated> full = Generated{};
      if (o.tpot_full) full = GenerateOnce(router, ctx, o.decode_tokens, 0, "tpot-full");
      auto sparse = full.ok() ? GenerateOnce(router, ctx, o.decode_tokens, o.budget_pages, "tpot-sparse") : full;
      if (!full.ok() || !sparse.ok()) {
        std::fprintf(stderr, "tpot: %s\n", (full.ok() ? sparse.status() : full.status()).ToString().c_str());
        return 1;
      }
      nlohmann::json row = {{"context", ctx},
                            {"budget_pages", o.budget_pages},
                            {"sparse_wall_s", sparse->wall_per_token},
                            {"sparse_cpu_s", sparse->cpu_per_token},
                            {"sparse_pages_fetched", sparse->last.pages_fetched}};
      if (o.tpot_full) {
        row["full_wall_s"] = full->wall_per_token;
        row["full_cpu_s"] = full->cpu_per_token;
        row["ratio_cpu"] = sparse->cpu_per_token / full->cpu_per_token;
      }
      out["tpot"].push_back(row);
      if (!o.json) {
        if (o.tpot_full) {
          std::printf("tpot  context %6d: full %.2f ms wall / %.2f ms CPU, ", ctx, full->wall_per_token * 1e3,
                      full->cpu_per_token * 1e3);
        } else {
          std::printf("tpot  context %6d: ", ctx);
        }
        std::printf("budget %d %.2f ms wall / %.2f ms CPU", o.budget_pages, sparse->wall_per_token * 1e3,
                    sparse->cpu_per_token * 1e3);
        if (o.tpot_full) std::printf(" (CPU ratio %.2f)", sparse->cpu_per_token / full->cpu_per_token);
        std::printf("\n");
      }
    }
  }
  if (has("router")) {
    // The two paths alternate so that both see the same load; medians over the repeats.
    const int prompt = 256, tokens = std::max(64, o.decode_tokens);
    std::vector<double> via_wall, via_cpu, direct_wall, direct_cpu;
    for (int rep = 0; rep < o.router_repeats; ++rep) {
      auto via = GenerateOnce(router, prompt, tokens, 0);
      auto direct = via.ok() ? DirectTpot(**c, prompt, tokens) : via;
      if (!via.ok() || !direct.ok()) {
        std::fprintf(stderr, "router: %s\n", (via.ok() ? direct.status() : via.status()).ToString().c_str());
        return 1;
      }
      via_wall.push_back(via->wall_per_token);
      via_cpu.push_back(via->cpu_per_token);
      direct_wall.push_back(direct->wall_per_token);
      direct_cpu.push_back(direct->cpu_per_token);
    }
    const double vw = Median(via_wall), dw = Median(direct_wall), vc = Median(via_cpu), dc = Median(direct_cpu);
    out["router"] = {{"repeats", o.router_repeats},
                     {"via_router_wall_s", vw},
                     {"direct_wall_s", dw},
                     {"via_router_cpu_s", vc},
                     {"direct_cpu_s", dc},
                     {"overhead_wall_fraction", (vw - dw) / dw},
                     {"overhead_cpu_fraction", (vc - dc) / dc}};
    if (!o.json) {
      std::printf("router  per token (median of %d): via router %.3f ms wall / %.3f ms CPU, straight from the decode "
                  "worker %.3f ms wall / %.3f ms CPU (overhead %+.1f %% wall, %+.1f %% CPU)\n",
                  o.router_repeats, vw * 1e3, vc * 1e3, dw * 1e3, dc * 1e3, 100 * (vw - dw) / dw, 100 * (vc - dc) / dc);
    }
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
ICE_BENCH_WORKLOAD("cluster", "disaggregated cluster: TTFT breakdown, TPOT vs context, router overhead, UCX GB/s",
                   RunCluster);
}  // namespace icecache::bench
