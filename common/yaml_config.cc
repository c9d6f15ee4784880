#include "common/yaml_config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace icecache {

Status ParseYaml(const std::string& text, const std::string& origin, YAML::Node* out) {
  try {
    *out = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(origin + ": invalid YAML at line " + std::to_string(e.mark.line + 1) +
                                ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  return Status::Ok();
}

Status LoadYamlFile(const std::string& path, YAML::Node* out) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseYaml(ss.str(), path, out);
}

}  // namespace icecache
