#include "common/yaml_config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace icecache {
namespace {

TEST(YamlConfigTest, ParsesAndReportsPosition) {
  YAML::Node node;
  ASSERT_TRUE(ParseYaml("port: 50051\nmodel: /m\n", "inline", &node).ok());
  EXPECT_EQ(node["port"].as<int>(), 50051);
  Status bad = ParseYaml("a: [1, 2\n", "cfg.yaml", &node);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cfg.yaml"), std::string::npos);
  EXPECT_NE(bad.message().find("line"), std::string::npos);
}

TEST(YamlConfigTest, MissingFileIsNotFound) {
  YAML::Node node;
  EXPECT_EQ(LoadYamlFile("/nonexistent/icecache.yaml", &node).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace icecache
