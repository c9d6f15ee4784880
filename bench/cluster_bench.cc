// icecache-bench cluster: measurements of the disaggregated path on loopback, each against a
// baseline from the same run.
//   ttft      TTFT and its breakdown (prefill queue, compute, tree build, transfer) per prompt size
//   tpot      TPOT vs context for budget full and budget 16 (ratio sparse / full)
//   router    time per token through the router vs streaming straight from the decode worker
//   ucx       UCX page shipping GB/s vs memcpy GB/s of the same bytes
// Everything runs in this process: real gRPC servers on 127.0.0.1 and real UCX between them.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/workload.h"
#include "decode_worker/decode_server.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "model/random_checkpoint.h"
#include "prefill_worker/prefill_server.h"
#include "proto/grpc_util.h"
#include "router/client.h"
#include "router/router_server.h"
#include "transport/transport.h"

namespace icecache::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Options {
  std::vector<int> ttft_prompts = {256, 1024, 4096};
  std::vector<int> contexts = {4096, 8192, 16384};
  int decode_tokens = 32;
  int hidden = 256, layers = 4, heads = 4, kv_heads = 2;
  std::string parts = "ttft,tpot,router,ucx";
  bool json = false;
  std::string tls = "tcp,sm,self";
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

StatusOr<std::unique_ptr<Cluster>> StartCluster(const Options& o, const std::string& dir, int max_context) {
  auto c = std::make_unique<Cluster>();
  auto& cfg = c->config;
  cfg.model.dir = dir;
  cfg.cache.page_size = 16;
  cfg.limits.max_tokens = 4096;
  cfg.limits.max_prompt_tokens = max_context + 1;
  cfg.router.listen = cfg.prefill.listen = cfg.decode.listen = "127.0.0.1:0";
  cfg.router.stats_refresh_seconds = 0.05;
  cfg.router.kv_transfer_timeout_seconds = 600;
  cfg.ucx.transfer_timeout_seconds = 600;
  cfg.ucx.tls = o.tls;
  cfg.ucx.net_devices = "lo";
  cfg.prefill.max_batch_tokens = max_context + 1;
  // Full attention reserves every token's page in every (layer, kv head), +25 % for trees.
  cfg.decode.pool_pages = static_cast<int64_t>(o.layers) * o.kv_heads * ((max_context + 4096) / 16 + 8) * 2;
  ICE_ASSIGN_OR_RETURN(c->prefill, prefill::PrefillServer::Start(cfg));
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

StatusOr<router::RemoteChunk> GenerateOnce(const std::string& router, int prompt, int max_tokens, int budget) {
  router::RemoteGenerateOptions g;
  g.router = router;
  g.prompt_ids = Prompt(prompt);
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  g.budget_pages = budget;
  router::RemoteChunk last;
  ICE_RETURN_IF_ERROR(router::RunRemoteGenerate(g, [&](const router::RemoteChunk& c) {
    if (c.last) last = c;
    return true;
  }));
  return last;
}

// Reserve -> Prefill -> Decode with the worker stubs directly; returns seconds per decoded token
// (after the first streamed message).
StatusOr<double> DirectTpot(Cluster& c, int prompt, int max_tokens) {
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
  pb::PrefillResponse prefilled;
  {
    grpc::ClientContext ctx;
    ICE_RETURN_IF_ERROR(cluster::FromGrpc(pstub->Prefill(&ctx, pr, &prefilled)));
  }
  pb::DecodeRequest dr;
  dr.set_sequence_id(reserved.sequence_id());
  dr.set_first_token(prefilled.first_token());
  dr.set_max_tokens(max_tokens);
  dr.set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = dstub->Decode(&ctx, dr);
  pb::DecodeResponse resp;
  int tokens = 0;
  Clock::time_point first{};
  while (reader->Read(&resp)) {
    if (tokens == 0 && resp.token_ids_size() > 0) first = Clock::now();
    tokens += resp.token_ids_size();
  }
  ICE_RETURN_IF_ERROR(cluster::FromGrpc(reader->Finish()));
  return tokens > 1 ? Since(first) / (tokens - 1) : 0.0;
}

int RunCluster(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--json") o.json = true;
    else if (a == "--parts") o.parts = next();
    else if (a == "--ttft-prompts") o.ttft_prompts = ParseInts(next());
    else if (a == "--contexts") o.contexts = ParseInts(next());
    else if (a == "--decode-tokens") o.decode_tokens = std::atoi(next().c_str());
    else if (a == "--hidden") o.hidden = std::atoi(next().c_str());
    else if (a == "--layers") o.layers = std::atoi(next().c_str());
    else if (a == "--tls") o.tls = next();
    else {
      std::fprintf(stderr,
                   "usage: icecache-bench cluster [--parts ttft,tpot,router,ucx] [--ttft-prompts 256,1024]\n"
                   "       [--contexts 4096,8192] [--decode-tokens N] [--hidden H] [--layers L] [--tls T] [--json]\n");
      return 2;
    }
  }
  auto has = [&](const char* p) { return o.parts.find(p) != std::string::npos; };
  nlohmann::json out;
  out["model"] = {{"hidden", o.hidden}, {"layers", o.layers}, {"heads", o.heads}, {"kv_heads", o.kv_heads}};

  if (has("ucx")) {
    auto rx = transport::CreateUcxTransport({o.tls, "lo"});
    auto tx = transport::CreateUcxTransport({o.tls, "lo"});
    if (!rx.ok() || !tx.ok()) {
      std::fprintf(stderr, "ucx: %s\n", (rx.ok() ? tx.status() : rx.status()).ToString().c_str());
      return 1;
    }
    for (size_t page : {size_t{16} << 10, size_t{1} << 20}) {
      const size_t total = size_t{256} << 20;
      const size_t n = total / page;
      std::vector<uint8_t> src(total, 1), dst(total, 0);
      std::vector<transport::Segment> segs;
      for (size_t i = 0; i < n; ++i) segs.push_back({static_cast<uint32_t>(i), src.data() + i * page, page});
      double best_ucx = 1e9, best_memcpy = 1e9;
      for (int rep = 0; rep < 3; ++rep) {
        uint64_t id = rep + 1 + (page << 8);
        (void)(*rx)->Expect(id, [&](uint32_t idx, size_t) -> StatusOr<void*> { return dst.data() + idx * page; });
        auto t0 = Clock::now();
        auto deadline = t0 + std::chrono::seconds(60);
        Status s = (*tx)->Send((*rx)->address(), id, segs, deadline);
        if (s.ok()) s = (*tx)->Finish((*rx)->address(), id, static_cast<uint32_t>(n), deadline);
        if (s.ok()) s = (*rx)->Wait(id, deadline);
        if (!s.ok()) {
          std::fprintf(stderr, "ucx: %s\n", s.ToString().c_str());
          return 1;
        }
        best_ucx = std::min(best_ucx, Since(t0));
        t0 = Clock::now();
        for (size_t i = 0; i < n; ++i) std::memcpy(dst.data() + i * page, src.data() + i * page, page);
        best_memcpy = std::min(best_memcpy, Since(t0));
      }
      double ucx_gbs = total / best_ucx / 1e9, memcpy_gbs = total / best_memcpy / 1e9;
      out["ucx"].push_back({{"segment_bytes", page}, {"ucx_gb_s", ucx_gbs}, {"memcpy_gb_s", memcpy_gbs},
                            {"ratio", ucx_gbs / memcpy_gbs}});
      if (!o.json) {
        std::printf("ucx   %7zu-byte segments (%s): UCX %.2f GB/s, memcpy %.2f GB/s, ratio %.2f\n", page,
                    o.tls.c_str(), ucx_gbs, memcpy_gbs, ucx_gbs / memcpy_gbs);
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
    for (int p : o.ttft_prompts) {
      for (int budget : {0, 16}) {
        auto r = GenerateOnce(router, p, 2, budget);
        if (!r.ok()) {
          std::fprintf(stderr, "ttft: %s\n", r.status().ToString().c_str());
          return 1;
        }
        out["ttft"].push_back({{"prompt", p}, {"budget", budget}, {"ttft_s", r->ttft_seconds},
                               {"prefill_compute_s", r->prefill_compute_seconds}, {"tree_build_s", r->tree_build_seconds},
                               {"transfer_s", r->transfer_seconds}, {"transfer_bytes", r->transfer_bytes}});
        if (!o.json) {
          std::printf("ttft  prompt %6d %-5s: TTFT %.3f s = compute %.3f + tree build %.3f + transfer %.3f (%.1f MB) + rest %.3f\n",
                      p, budget ? "b16" : "full", r->ttft_seconds, r->prefill_compute_seconds, r->tree_build_seconds,
                      r->transfer_seconds, r->transfer_bytes / 1e6,
                      r->ttft_seconds - r->prefill_compute_seconds - r->tree_build_seconds - r->transfer_seconds);
        }
      }
    }
  }
  if (has("tpot")) {
    for (int ctx : o.contexts) {
      auto full = GenerateOnce(router, ctx, o.decode_tokens, 0);
      auto sparse = GenerateOnce(router, ctx, o.decode_tokens, 16);
      if (!full.ok() || !sparse.ok()) {
        std::fprintf(stderr, "tpot: %s\n", (full.ok() ? sparse.status() : full.status()).ToString().c_str());
        return 1;
      }
      out["tpot"].push_back({{"context", ctx}, {"full_s", full->tpot_seconds}, {"budget16_s", sparse->tpot_seconds},
                             {"ratio", sparse->tpot_seconds / full->tpot_seconds}});
      if (!o.json) {
        std::printf("tpot  context %6d: full %.2f ms, budget 16 %.2f ms (ratio %.2f)\n", ctx, full->tpot_seconds * 1e3,
                    sparse->tpot_seconds * 1e3, sparse->tpot_seconds / full->tpot_seconds);
      }
    }
  }
  if (has("router")) {
    const int prompt = 256, tokens = std::max(64, o.decode_tokens);
    auto via = GenerateOnce(router, prompt, tokens, 0);
    auto direct = DirectTpot(**c, prompt, tokens);
    if (!via.ok() || !direct.ok()) {
      std::fprintf(stderr, "router: %s\n", (via.ok() ? direct.status() : via.status()).ToString().c_str());
      return 1;
    }
    out["router"] = {{"via_router_s", via->tpot_seconds}, {"direct_s", *direct},
                     {"overhead_per_token_s", via->tpot_seconds - *direct}};
    if (!o.json) {
      std::printf("router  per token: via router %.3f ms, straight from the decode worker %.3f ms (overhead %.3f ms)\n",
                  via->tpot_seconds * 1e3, *direct * 1e3, (via->tpot_seconds - *direct) * 1e3);
    }
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
ICE_BENCH_WORKLOAD("cluster", "disaggregated cluster: TTFT breakdown, TPOT vs context, router overhead, UCX GB/s",
                   RunCluster);
}  // namespace icecache::bench
