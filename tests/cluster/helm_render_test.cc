// The chart as rendered (scripts/render-chart.sh, run by the CTest fixture chart_render into
// ICECACHE_BINARY_DIR/helm-render): the ConfigMap's cluster.yaml of every values set loads under
// the one config schema, and the chart's wiring (discovery names, device from gpus, metrics ports)
// is what the processes will read. helm_values_test checks values.yaml alone; this one checks what
// the templates make of it. Skipped when the renderer could not run (no Go / no apt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "serving/cluster_config.h"

namespace icecache::cluster {
namespace {

std::string RenderedConfig(const std::string& set) {
  return std::string(ICECACHE_BINARY_DIR) + "/helm-render/" + set + "/cluster.yaml";
}

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  text->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return true;
}

class HelmRender : public ::testing::TestWithParam<const char*> {};

TEST_P(HelmRender, ConfigMapLoadsInTheConfigParser) {
  const std::string path = RenderedConfig(GetParam());
  std::string text;
  if (!ReadFile(path, &text)) {
    GTEST_SKIP() << path << " is missing: scripts/render-chart.sh did not run or could not install "
                 << "Go (CTest test chart_render); the rendered chart is not checked";
  }
  auto c = ParseClusterConfig(text, path);
  ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << text;
  // The release is rendered as "icecache" in namespace "inference".
  EXPECT_EQ(c->router.prefill.dns, "icecache-prefill-headless.inference.svc.cluster.local:50061");
  EXPECT_EQ(c->router.decode.dns, "icecache-decode-headless.inference.svc.cluster.local:50071");
  EXPECT_TRUE(c->router.prefill.addresses.empty());
  EXPECT_EQ(c->router.listen, "0.0.0.0:50051");
  EXPECT_EQ(c->router.metrics_port, 9400);
  EXPECT_EQ(c->router.http_port, 8000);  // ports.http: the OpenAI-compatible API
  EXPECT_EQ(c->prefill.metrics_port, 9401);
  EXPECT_EQ(c->decode.metrics_port, 9402);
  const std::string set = GetParam();
  if (set == "init") {  // gpus: 0 in ci/init-values.yaml
    EXPECT_EQ(c->prefill.device, "cpu");
    EXPECT_EQ(c->decode.device, "cpu");
  } else {
    EXPECT_EQ(c->prefill.device, "cuda:0");
    EXPECT_EQ(c->decode.device, "cuda:0");
  }
  if (set == "gpu") {  // ci/gpu-values.yaml overrides these config keys
    EXPECT_EQ(c->decode.pool_pages, 524288);
    EXPECT_EQ(c->cache.device_cache_pages, 65536);
    EXPECT_EQ(c->model.dir, "/models/llama-3.1-8b");
    // internalTls.secretName: mutual TLS from the mounted Secret.
    EXPECT_TRUE(c->internal_tls.enabled());
    EXPECT_EQ(c->internal_tls.ca_file, "/etc/icecache-tls/ca.crt");
    EXPECT_EQ(c->internal_tls.key_file, "/etc/icecache-tls/tls.key");
    EXPECT_EQ(c->internal_tls.server_name, "icecache-internal");
  } else {
    EXPECT_FALSE(c->internal_tls.enabled());
  }
}

TEST_P(HelmRender, EveryIcecacheContainerGetsTheEnvironment) {
  const std::string path = std::string(ICECACHE_BINARY_DIR) + "/helm-render/" + GetParam() + "/rendered.yaml";
  std::string text;
  if (!ReadFile(path, &text)) GTEST_SKIP() << path << " is missing (see ConfigMapLoadsInTheConfigParser)";
  size_t n = 0;
  for (size_t at = text.find("name: GOMP_SPINCOUNT"); at != std::string::npos;
       at = text.find("name: GOMP_SPINCOUNT", at + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 3u) << "one per router, prefill and decode container";
}

// Each Deployment gives its pods drain_seconds + 10 s between SIGTERM and SIGKILL, so a drain
// (stop admitting, finish streams) runs to its end.
TEST_P(HelmRender, TerminationGraceCoversTheDrain) {
  const std::string path = std::string(ICECACHE_BINARY_DIR) + "/helm-render/" + GetParam() + "/rendered.yaml";
  std::string text;
  if (!ReadFile(path, &text)) GTEST_SKIP() << path << " is missing (see ConfigMapLoadsInTheConfigParser)";
  auto c = LoadClusterConfig(RenderedConfig(GetParam()));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // Deployments render in template order: decode.yaml, prefill.yaml, router.yaml.
  const double drains[] = {c->decode.drain_seconds, c->prefill.drain_seconds, c->router.drain_seconds};
  const std::string key = "terminationGracePeriodSeconds: ";
  size_t at = 0;
  int found = 0;
  for (double d : drains) {
    at = text.find(key, at);
    ASSERT_NE(at, std::string::npos) << "Deployment " << found << " has no terminationGracePeriodSeconds";
    at += key.size();
    EXPECT_EQ(std::atoi(text.c_str() + at), static_cast<int>(std::ceil(d)) + 10) << "Deployment " << found;
    ++found;
  }
  EXPECT_EQ(text.find(key, at), std::string::npos) << "more than three Deployments";
}

// Tensor parallelism: a worker pod requests gpus x tensorParallel GPUs and its process is told its
// rank count on the command line (the ConfigMap is shared by both worker components).
TEST_P(HelmRender, WorkersRequestGpusPerRankAndGetTheirTensorParallelSize) {
  const std::string set = GetParam();
  const std::string path = std::string(ICECACHE_BINARY_DIR) + "/helm-render/" + set + "/rendered.yaml";
  std::string text;
  if (!ReadFile(path, &text)) GTEST_SKIP() << path << " is missing (see ConfigMapLoadsInTheConfigParser)";
  // ci/gpu-values.yaml: decode tensorParallel 2, gpus 1; the default values: 1 and 1; init: gpus 0.
  const int decode_tp = set == "gpu" ? 2 : 1;
  const int gpus = set == "init" ? 0 : 1;
  int workers = 0;
  for (const YAML::Node& doc : YAML::LoadAll(text)) {
    if (!doc.IsMap() || doc["kind"].as<std::string>("") != "Deployment") continue;
    const std::string component = doc["metadata"]["labels"]["app.kubernetes.io/component"].as<std::string>("");
    if (component != "prefill" && component != "decode") continue;
    ++workers;
    const int tp = component == "decode" ? decode_tp : 1;
    const YAML::Node c = doc["spec"]["template"]["spec"]["containers"][0];
    std::vector<std::string> command;
    for (const auto& a : c["command"]) command.push_back(a.as<std::string>());
    const std::vector<std::string> want = {"icecache-" + component, "--config", "/etc/icecache/cluster.yaml", "--set",
                                           "parallel.tensor_parallel_size=" + std::to_string(tp)};
    EXPECT_EQ(command, want) << component;
    const YAML::Node gpu = c["resources"]["limits"]["nvidia.com/gpu"];
    if (gpus == 0) {
      EXPECT_FALSE(gpu.IsDefined()) << component;
    } else {
      ASSERT_TRUE(gpu.IsDefined()) << component;
      EXPECT_EQ(gpu.as<int>(), gpus * tp) << component;
    }
  }
  EXPECT_EQ(workers, 2);
}

INSTANTIATE_TEST_SUITE_P(ValuesSets, HelmRender, ::testing::Values("default", "gpu", "init"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace icecache::cluster
