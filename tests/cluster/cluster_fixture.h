// An in-process loopback cluster for tests: a random tiny model written to a temp dir, prefill
// and decode workers and a router, all real gRPC servers on 127.0.0.1 (ports picked by the
// kernel) talking over real UCX.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "decode_worker/decode_server.h"
#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "model/random_checkpoint.h"
#include "prefill_worker/prefill_server.h"
#include "serving/cluster_config.h"
#include "router/router_server.h"

namespace icecache::testing {

struct LoopbackCluster {
  std::string model_dir;
  cluster::ClusterConfig config;
  std::vector<std::unique_ptr<prefill::PrefillServer>> prefill;
  std::vector<std::unique_ptr<decode::DecodeServer>> decode;
  std::unique_ptr<router::RouterServer> router;

  // Writes the model (once per dir) and starts everything. page_size 4 so short prompts already
  // make multi-level trees.
  static std::unique_ptr<LoopbackCluster> Start(const std::string& dir, int num_prefill, int num_decode,
                                                const std::string& tls, bool with_tokenizer = true,
                                                int metrics_base = 0, int64_t pool_pages = 60000,
                                                const std::string& dci_preset = "reference",
                                                const std::string& kv_dtype = "f32",
                                                const std::function<void(cluster::ClusterConfig&)>& tweak = nullptr) {
    auto c = std::make_unique<LoopbackCluster>();
    c->model_dir = dir;
    if (!std::filesystem::exists(dir + "/config.json") && !dir.ends_with(".gguf")) {
      model::RandomModelSpec spec;
      spec.hidden = 64;
      spec.layers = 4;
      spec.heads = 4;
      spec.kv_heads = 2;
      spec.vocab = 320;
      spec.max_position = 4096;
      spec.dtype = kernels::DType::kF32;
      spec.seed = 7;
      spec.write_tokenizer = with_tokenizer;
      // ctest runs test cases as parallel processes: EnsureRandomCheckpoint writes aside and renames.
      Status s = model::EnsureRandomCheckpoint(dir, spec);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    auto& cfg = c->config;
    cfg.model.dir = dir;
    cfg.cache.page_size = 4;
    cfg.cache.default_budget_pages = 8;
    cfg.cache.dense_layers = 2;
    cfg.cache.sink_pages = 1;
    cfg.cache.window_pages = 2;
    cfg.cache.dci_preset = dci_preset;
    cfg.cache.kv_dtype = kv_dtype;  // f32: exact comparisons against fp32 single-process references
    cfg.limits.max_tokens = 4096;
    cfg.router.listen = "127.0.0.1:0";
    cfg.router.stats_refresh_seconds = 0.05;
    cfg.router.kv_transfer_timeout_seconds = 20;
    cfg.prefill.listen = "127.0.0.1:0";
    cfg.prefill.max_batch_tokens = 4096;
    cfg.decode.listen = "127.0.0.1:0";
    cfg.decode.pool_pages = pool_pages;
    cfg.decode.max_sequences = 64;
    cfg.ucx.tls = tls;
    cfg.ucx.net_devices = "lo";
    cfg.ucx.transfer_timeout_seconds = 20;
    if (tweak) tweak(cfg);
    int next_metrics = metrics_base > 0 ? metrics_base + 1 : 0;
    for (int i = 0; i < num_prefill; ++i) {
      cfg.prefill.metrics_port = metrics_base > 0 ? next_metrics++ : 0;
      auto p = prefill::PrefillServer::Start(cfg);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) return nullptr;
      cfg.router.prefill.addresses.push_back((*p)->address());
      c->prefill.push_back(std::move(*p));
    }
    for (int i = 0; i < num_decode; ++i) {
      cfg.decode.metrics_port = metrics_base > 0 ? next_metrics++ : 0;
      auto d = decode::DecodeServer::Start(cfg);
      EXPECT_TRUE(d.ok()) << d.status().ToString();
      if (!d.ok()) return nullptr;
      cfg.router.decode.addresses.push_back((*d)->address());
      c->decode.push_back(std::move(*d));
    }
    cfg.router.metrics_port = metrics_base;
    auto r = router::RouterServer::Start(cfg);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return nullptr;
    c->router = std::move(*r);
    return c;
  }

  ~LoopbackCluster() {
    if (router) router->Shutdown();
    for (auto& p : prefill) p->Shutdown();
    for (auto& d : decode) d->Shutdown();
  }
};

// Greedy tokens of one process (the reference the cluster must reproduce with budget full): a
// dense KV cache of page size 4 holding `dtype`.
inline std::vector<int32_t> SingleProcessGreedy(const std::string& dir, const std::vector<int32_t>& prompt, int max_tokens,
                                                kernels::DType dtype = kernels::DType::kF32) {
  auto m = model::Model::Load(dir);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  model::DenseKvCacheOptions o;
  o.page_size = 4;
  o.kv_dtype = dtype;
  model::DenseKvCache cache((*m)->attention_shape(), o);
  model::Generator gen(**m, cache);
  model::SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  auto id = gen.Add(prompt, p);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  std::vector<int32_t> out;
  while (!gen.idle()) {
    std::vector<model::GenerationEvent> ev;
    Status s = gen.Step(&ev);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) break;
    for (auto& e : ev) out.push_back(e.token);
  }
  return out;
}

}  // namespace icecache::testing
