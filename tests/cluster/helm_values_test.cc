// The Helm chart's cluster configuration (helm/icecache/values.yaml, `config:`) must stay valid
// under the one config schema: the chart's configmap template copies those sections and adds
// model.dir, listen addresses, metrics ports and DNS discovery, as done here. The schema rejects
// unknown keys, so a renamed or misspelt setting in the chart fails this test instead of a pod.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <iterator>
#include <string>

#include "serving/cluster_config.h"

namespace icecache::cluster {
namespace {

TEST(HelmValues, ConfigSectionsParseUnderTheSchema) {
  const std::string path = std::string(ICECACHE_SOURCE_DIR) + "/helm/icecache/values.yaml";
  YAML::Node values;
  try {
    values = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    FAIL() << path << ": " << e.what();
  }
  ASSERT_TRUE(values["config"].IsMap()) << path << " has no config: map";
  YAML::Node cfg = YAML::Clone(values["config"]);
  // What templates/configmap.yaml adds.
  cfg["model"]["dir"] = values["modelDir"].as<std::string>();
  cfg["router"]["listen"] = "0.0.0.0:" + values["ports"]["router"].as<std::string>();
  cfg["router"]["metrics_port"] = values["ports"]["routerMetrics"].as<int>();
  cfg["router"]["prefill"]["dns"] = "icecache-prefill-headless.ns.svc.cluster.local:50061";
  cfg["router"]["decode"]["dns"] = "icecache-decode-headless.ns.svc.cluster.local:50071";
  cfg["prefill"]["listen"] = "0.0.0.0:" + values["ports"]["prefill"].as<std::string>();
  cfg["prefill"]["metrics_port"] = values["ports"]["prefillMetrics"].as<int>();
  cfg["decode"]["listen"] = "0.0.0.0:" + values["ports"]["decode"].as<std::string>();
  cfg["decode"]["metrics_port"] = values["ports"]["decodeMetrics"].as<int>();
  YAML::Emitter out;
  out << cfg;
  auto c = ParseClusterConfig(out.c_str(), path);
  ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << out.c_str();
  EXPECT_EQ(c->cache.kv_dtype, values["config"]["cache"]["kv_dtype"].as<std::string>());
  EXPECT_EQ(c->decode.pool_pages, values["config"]["decode"]["pool_pages"].as<int64_t>());
  EXPECT_EQ(c->router.decode.dns, "icecache-decode-headless.ns.svc.cluster.local:50071");
}

TEST(HelmValues, EveryContainerGetsTheEnvironment) {
  // values.yaml's env (GOMP_SPINCOUNT=300) is applied by icecache.containerCommon
  // (_helpers.tpl), which the one workload template (_workload.tpl) every component's Deployment
  // comes from includes. cluster_helm_render_test counts it in the rendered chart.
  auto read = [](const std::string& name) {
    const std::string path = std::string(ICECACHE_SOURCE_DIR) + "/helm/icecache/templates/" + name;
    std::ifstream in(path);
    EXPECT_TRUE(in) << path;
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string helpers = read("_helpers.tpl");
  const size_t common = helpers.find("define \"icecache.containerCommon\"");
  ASSERT_NE(common, std::string::npos);
  EXPECT_NE(helpers.find("{{- with .Values.env }}", common), std::string::npos);
  EXPECT_NE(read("_workload.tpl").find("include \"icecache.containerCommon\""), std::string::npos);
  for (const char* t : {"router", "prefill", "decode"}) {
    EXPECT_NE(read(std::string(t) + ".yaml").find("include \"icecache.workload\""), std::string::npos) << t;
  }
}

}  // namespace
}  // namespace icecache::cluster
