#include <gtest/gtest.h>

#include <fstream>

#include "serving/cluster_config.h"
#include "serving/metric_families.h"

namespace icecache::cluster {
namespace {

TEST(ClusterConfig, DefaultsWhenEmpty) {
  auto c = ParseClusterConfig("", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.page_size, 16);
  EXPECT_EQ(c->cache.default_budget_pages, 16);
  EXPECT_EQ(c->decode.pool_pages, 262144);
}

TEST(ClusterConfig, ReadsEverySection) {
  const char* text = R"(
model: {dir: /m}
cache: {page_size: 32, default_budget_pages: 0, dense_layers: 1, sink_pages: 1, window_pages: 3}
limits: {max_tokens: 100, max_prompt_tokens: 2000}
router:
  listen: 0.0.0.0:7000
  metrics_port: 9100
  prefill: {addresses: [a:1, b:2]}
  decode: {dns: icecache-decode.ns.svc:7100}
  dns_refresh_seconds: 5
prefill: {listen: 127.0.0.1:7001, threads: 3, max_batch_tokens: 4096}
decode: {listen: 127.0.0.1:7002, pool_pages: 99, max_sequences: 7}
ucx: {tls: tcp, net_devices: lo, transfer_timeout_seconds: 2.5}
)";
  auto c = ParseClusterConfig(text, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.dir, "/m");
  EXPECT_EQ(c->cache.page_size, 32);
  EXPECT_EQ(c->cache.default_budget_pages, 0);
  EXPECT_EQ(c->limits.max_prompt_tokens, 2000);
  EXPECT_EQ(c->router.metrics_port, 9100);
  EXPECT_EQ(c->router.prefill.addresses, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(c->router.decode.dns, "icecache-decode.ns.svc:7100");
  EXPECT_EQ(c->prefill.threads, 3);
  EXPECT_EQ(c->decode.pool_pages, 99);
  EXPECT_EQ(c->ucx.tls, "tcp");
  EXPECT_DOUBLE_EQ(c->ucx.transfer_timeout_seconds, 2.5);
}

TEST(ClusterConfig, ErrorsNameFileAndKey) {
  auto c = ParseClusterConfig("decode: {pool_pages: -3}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("x.yaml: decode.pool_pages: must be in"), std::string::npos)
      << c.status().message();

  c = ParseClusterConfig("decode: {pool_pagez: 3}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("decode.pool_pagez: unknown key"), std::string::npos) << c.status().message();

  c = ParseClusterConfig("cache: {page_size: many}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cache.page_size: must be a number"), std::string::npos);

  c = ParseClusterConfig("router: {listen: nohostport}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("expected HOST:PORT"), std::string::npos);

  c = ParseClusterConfig("cache: {default_budget_pages: 3}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("default_budget_pages"), std::string::npos);

  c = ParseClusterConfig("cache: {dci_preset: fast}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cache.dci_preset: must be reference, tuned or flat"), std::string::npos);

  c = ParseClusterConfig("cache: {dci_fov_fraction: 2}", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cache.dci_fov_fraction"), std::string::npos) << c.status().ToString();

  c = ParseClusterConfig("router: [1, 2", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("x.yaml: invalid YAML at line"), std::string::npos);
}

TEST(ClusterConfig, OverridesWinOverFile) {
  auto c = ParseClusterConfig("decode: {pool_pages: 10}\n", "x.yaml",
                              {"decode.pool_pages=20", "router.prefill.addresses=h:1,h:2", "model.dir=/z"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode.pool_pages, 20);
  EXPECT_EQ(c->router.prefill.addresses, (std::vector<std::string>{"h:1", "h:2"}));
  EXPECT_EQ(c->model.dir, "/z");
  auto bad = ParseClusterConfig("", "x.yaml", {"decode.pool_pages"});
  EXPECT_FALSE(bad.ok());
  bad = ParseClusterConfig("", "x.yaml", {"decode.pool_pages=lots"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("decode.pool_pages"), std::string::npos);
}

TEST(ClusterConfig, CommandLineAndRoundTrip) {
  std::string path = ::testing::TempDir() + "/cluster_config_test.yaml";
  {
    std::ofstream f(path);
    f << "decode: {max_sequences: 5}\n";
  }
  std::vector<std::string> args = {"icecache-decode", "--config", path, "--listen=127.0.0.1:9",
                                   "--set", "decode.threads=2", "--model", "/mm"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto c = ConfigFromCommandLine(static_cast<int>(argv.size()), argv.data(), "decode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode.max_sequences, 5);
  EXPECT_EQ(c->decode.listen, "127.0.0.1:9");
  EXPECT_EQ(c->decode.threads, 2);
  EXPECT_EQ(c->model.dir, "/mm");

  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ClusterConfigToYaml(*again), ClusterConfigToYaml(*c));

  std::vector<std::string> bad_args = {"x", "--frobnicate"};
  std::vector<char*> bad_argv;
  for (auto& a : bad_args) bad_argv.push_back(a.data());
  EXPECT_FALSE(ConfigFromCommandLine(2, bad_argv.data(), "decode").ok());
}

TEST(ClusterConfig, HttpApiKeys) {
  auto d = ParseClusterConfig("", "defaults");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->router.http_port, 0);  // off unless asked for
  EXPECT_EQ(d->router.http_threads, 256);
  auto c = ParseClusterConfig("model: {name: tiny}\nrouter: {http_port: 8000, http_threads: 8}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->router.http_port, 8000);
  EXPECT_EQ(c->router.http_threads, 8);
  EXPECT_EQ(c->model.name, "tiny");
  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "roundtrip");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->router.http_port, 8000);
  EXPECT_EQ(again->model.name, "tiny");
  auto bad = ParseClusterConfig("router: {http_port: 70000}\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("router.http_port"), std::string::npos) << bad.status().message();

  std::vector<std::string> args = {"icecache-router", "--http-port", "8001"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto r = ConfigFromCommandLine(static_cast<int>(argv.size()), argv.data(), "router");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->router.http_port, 8001);
  // API keys: from the file and from --api-key (appended; kept out of YAML parsing).
  auto k = ParseClusterConfig("router: {api_keys: [a1, b2]}\n", "t.yaml");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->router.api_keys, (std::vector<std::string>{"a1", "b2"}));
  EXPECT_FALSE(ParseClusterConfig("router: {api_keys: ['has space']}\n", "t.yaml").ok());
  std::vector<std::string> kargs = {"icecache-router", "--api-key", "k:{1}", "--api-key=k2"};
  std::vector<char*> kargv;
  for (auto& a : kargs) kargv.push_back(a.data());
  auto kr = ConfigFromCommandLine(static_cast<int>(kargv.size()), kargv.data(), "router");
  ASSERT_TRUE(kr.ok()) << kr.status().ToString();
  EXPECT_EQ(kr->router.api_keys, (std::vector<std::string>{"k:{1}", "k2"}));
  EXPECT_FALSE(ConfigFromCommandLine(static_cast<int>(kargv.size()), kargv.data(), "prefill").ok());
  // Only the router serves HTTP.
  auto w = ConfigFromCommandLine(static_cast<int>(argv.size()), argv.data(), "decode");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("only the router"), std::string::npos);
}

TEST(ClusterConfig, KvDtypeAndShippingKeys) {
  auto c = ParseClusterConfig("", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.kv_dtype, "bf16");  // the default
  EXPECT_TRUE(c->prefill.overlap_tree_build);
  EXPECT_EQ(c->ucx.max_segment_bytes, 4 << 20);

  c = ParseClusterConfig("cache: {kv_dtype: f16}\nprefill: {overlap_tree_build: false}\nucx: {max_segment_bytes: 65536}\n",
                         "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.kv_dtype, "f16");
  EXPECT_FALSE(c->prefill.overlap_tree_build);
  EXPECT_EQ(c->ucx.max_segment_bytes, 65536);

  c = ParseClusterConfig("cache: {kv_dtype: fp8}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("t.yaml: cache.kv_dtype: must be bf16, f16 or f32, got 'fp8'"), std::string::npos)
      << c.status().message();
  c = ParseClusterConfig("prefill: {overlap_tree_build: maybe}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("prefill.overlap_tree_build: must be true or false"), std::string::npos)
      << c.status().message();
  c = ParseClusterConfig("ucx: {max_segment_bytes: 0}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("ucx.max_segment_bytes: must be in"), std::string::npos);

  // The shorthand and --set both reach the same key; the YAML round trip keeps it.
  std::vector<std::string> args = {"icecache-prefill", "--kv-dtype", "f32", "--set", "ucx.max_segment_bytes=8192"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  c = ConfigFromCommandLine(static_cast<int>(argv.size()), argv.data(), "prefill");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.kv_dtype, "f32");
  EXPECT_EQ(c->ucx.max_segment_bytes, 8192);
  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->cache.kv_dtype, "f32");
  EXPECT_EQ(again->ucx.max_segment_bytes, 8192);
  std::vector<std::string> bad = {"icecache-decode", "--kv-dtype=int8"};
  std::vector<char*> bad_argv;
  for (auto& a : bad) bad_argv.push_back(a.data());
  c = ConfigFromCommandLine(2, bad_argv.data(), "decode");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cache.kv_dtype"), std::string::npos) << c.status().message();
}

TEST(ClusterConfig, ServedModelName) {
  auto c = ParseClusterConfig("model: {dir: /models/x, name: my-model}\n", "inline");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.name, "my-model");
  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->model.name, "my-model");
  EXPECT_EQ(ServedModelName(c->model.name, c->model.dir), "my-model");
  EXPECT_EQ(ServedModelName("", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct.Q4_1");
  EXPECT_EQ(ServedModelName("", "/models/llama-3.2-1b/"), "llama-3.2-1b");
  EXPECT_EQ(ServedModelName("", "tools/models/passkey"), "passkey");
}

TEST(ClusterConfig, ParallelSection) {
  auto c = ParseClusterConfig("", "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->parallel.tensor_parallel_size, 1);
  c = ParseClusterConfig("parallel: {tensor_parallel_size: 4}", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->parallel.tensor_parallel_size, 4);
  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->parallel.tensor_parallel_size, 4);
  c = ParseClusterConfig("", "t.yaml", {"parallel.tensor_parallel_size=2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->parallel.tensor_parallel_size, 2);
  for (const char* bad : {"parallel: {tensor_parallel_size: 0}", "parallel: {tp: 2}"}) {
    c = ParseClusterConfig(bad, "t.yaml");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("parallel"), std::string::npos) << c.status().ToString();
  }
}

// Per-rank devices of a tensor-parallel worker: a YAML list or a comma list on the command line,
// kept through the YAML round trip; RankDevices checks the count against the TP size and parses.
TEST(ClusterConfig, RankDevicesPerWorker) {
  auto c = ParseClusterConfig("parallel: {tensor_parallel_size: 2}\ndecode: {devices: [cuda:2, cuda:3]}", "t.yaml",
                              {"prefill.devices=cpu,cpu"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->decode.devices, (std::vector<std::string>{"cuda:2", "cuda:3"}));
  EXPECT_EQ(c->prefill.devices, (std::vector<std::string>{"cpu", "cpu"}));
  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->decode.devices, c->decode.devices);
  EXPECT_TRUE(ParseClusterConfig("", "t.yaml")->decode.devices.empty());

  auto d = RankDevices(c->decode.devices, 2, "decode");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, (std::vector<kernels::Device>{{kernels::Backend::kCuda, 2}, {kernels::Backend::kCuda, 3}}));
  auto none = RankDevices({}, 4, "decode");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());  // the ranks follow decode.device
  auto count = RankDevices(c->decode.devices, 4, "decode");
  EXPECT_EQ(count.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(count.status().message().find("decode.devices lists 2 devices for parallel.tensor_parallel_size 4"),
            std::string::npos)
      << count.status().ToString();
  auto bad = RankDevices({"cuda:0", "tpu"}, 2, "prefill");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("prefill.devices"), std::string::npos) << bad.status().ToString();
  EXPECT_FALSE(ParseClusterConfig("decode: {devices: {a: 1}}", "t.yaml").ok());
}

TEST(ClusterConfig, ExampleConfigIsValid) {
  auto c = LoadClusterConfig(std::string(ICECACHE_SOURCE_DIR) + "/config/cluster.example.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
}

TEST(ClusterConfig, DciFieldOfViewOverride) {
  auto c = ParseClusterConfig("", "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cache.dci_fov_fraction, 0.0);  // the preset's
  c = ParseClusterConfig("cache: {dci_fov_fraction: 2.5e-4}", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->cache.dci_fov_fraction, 2.5e-4);
  auto again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_DOUBLE_EQ(again->cache.dci_fov_fraction, 2.5e-4);

  EXPECT_EQ(c->cache.dci_fov_min, 0);  // the preset's
  c = ParseClusterConfig("cache: {dci_fov_min: 128}", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.dci_fov_min, 128);
  again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->cache.dci_fov_min, 128);
  c = ParseClusterConfig("cache: {dci_fov_min: -1}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("cache.dci_fov_min"), std::string::npos) << c.status().ToString();

  c = ParseClusterConfig("{}", "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cache.dci_group_fov, 0);  // the preset's
  c = ParseClusterConfig("cache: {dci_group_fov: 2}", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->cache.dci_group_fov, 2);
  again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_DOUBLE_EQ(again->cache.dci_group_fov, 2);
  for (const char* bad : {"cache: {dci_group_fov: -1}", "cache: {dci_group_fov: 65}"}) {
    c = ParseClusterConfig(bad, "t.yaml");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("cache.dci_group_fov"), std::string::npos) << c.status().ToString();
  }

  // cache.rest_estimate: on by default (the serving default of kvstore::RetrievalPolicy), off by
  // name, round-trips, and a non-boolean is refused naming the key.
  c = ParseClusterConfig("{}", "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->cache.rest_estimate);
  c = ParseClusterConfig("cache: {rest_estimate: false}", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->cache.rest_estimate);
  again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->cache.rest_estimate);
  c = ParseClusterConfig("cache: {rest_estimate: maybe}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("cache.rest_estimate"), std::string::npos) << c.status().ToString();
  c = ParseClusterConfig("cache: {rest_cells: 48}", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->cache.rest_cells, 48);
  again = ParseClusterConfig(ClusterConfigToYaml(*c), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->cache.rest_cells, 48);
  c = ParseClusterConfig("cache: {rest_cells: -1}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cache.rest_cells"), std::string::npos) << c.status().ToString();
}

}  // namespace
}  // namespace icecache::cluster
