// Loading YAML configuration files with errors that name the file and the key.
// The schema itself (ports, model, budgets, pools) lives with the services that read it.
#pragma once

#include <string>

#include "common/status.h"

namespace YAML {
class Node;
}

namespace icecache {

// Parses the YAML file at `path`. Errors: NOT_FOUND (missing file), INVALID_ARGUMENT (bad YAML,
// with line and column).
Status LoadYamlFile(const std::string& path, YAML::Node* out);

// Parses YAML text; `origin` names the source in error messages.
Status ParseYaml(const std::string& text, const std::string& origin, YAML::Node* out);

}  // namespace icecache
