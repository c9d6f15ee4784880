#include "serving/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include "common/yaml_config.h"
#include "kernels/backend.h"

namespace icecache::cluster {
namespace {

// Reads typed values of one YAML mapping, naming "origin: section.key" in every error.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, const std::string& origin)
      : node_(node), path_(std::move(path)), origin_(origin) {}

  Status CheckShape(const std::set<std::string>& known) const {
    if (!node_ || node_.IsNull()) return Status::Ok();
    if (!node_.IsMap()) return Error(path_, "must be a mapping");
    for (const auto& kv : node_) {
      std::string key = kv.first.as<std::string>();
      if (!known.count(key)) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        return Error(Join(key), "unknown key (known: " + list + ")");
      }
    }
    return Status::Ok();
  }

  template <typename T>
  Status Number(const std::string& key, T* out, T min, T max) const {
    YAML::Node v = Child(key);
    if (!v) return Status::Ok();
    T value;
    try {
      if (!v.IsScalar()) return Error(Join(key), "must be a number");
      value = v.as<T>();
    } catch (const YAML::Exception&) {
      return Error(Join(key), "must be a number, got '" + v.Scalar() + "'");
    }
    if (value < min || value > max) {
      std::ostringstream os;
      os << "must be in [" << min << ", " << max << "], got " << value;
      return Error(Join(key), os.str());
    }
    *out = value;
    return Status::Ok();
  }

  Status String(const std::string& key, std::string* out) const {
    YAML::Node v = Child(key);
    if (!v) return Status::Ok();
    if (v.IsNull()) {
      out->clear();
      return Status::Ok();
    }
    if (!v.IsScalar()) return Error(Join(key), "must be a string");
    *out = v.Scalar();
    return Status::Ok();
  }

  Status Bool(const std::string& key, bool* out) const {
    YAML::Node v = Child(key);
    if (!v) return Status::Ok();
    if (!v.IsScalar()) return Error(Join(key), "must be true or false");
    const std::string& t = v.Scalar();
    if (t == "true" || t == "True" || t == "yes" || t == "on") {
      *out = true;
    } else if (t == "false" || t == "False" || t == "no" || t == "off") {
      *out = false;
    } else {
      return Error(Join(key), "must be true or false, got '" + t + "'");
    }
    return Status::Ok();
  }

  Status StringList(const std::string& key, std::vector<std::string>* out) const {
    YAML::Node v = Child(key);
    if (!v || v.IsNull()) return Status::Ok();
    out->clear();
    if (v.IsScalar()) {  // "a:1,b:2" is accepted too (handy on the command line)
      std::stringstream ss(v.Scalar());
      std::string item;
      while (std::getline(ss, item, ',')) {
        if (!item.empty()) out->push_back(item);
      }
      return Status::Ok();
    }
    if (!v.IsSequence()) return Error(Join(key), "must be a list of strings");
    for (const auto& item : v) {
      if (!item.IsScalar()) return Error(Join(key), "must be a list of strings");
      out->push_back(item.Scalar());
    }
    return Status::Ok();
  }

  MapReader Sub(const std::string& key) const { return MapReader(Child(key), Join(key), origin_); }

 private:
  YAML::Node Child(const std::string& key) const {
    if (!node_ || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    return node_[key];
  }
  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  Status Error(const std::string& key, const std::string& problem) const {
    return InvalidArgumentError(origin_ + ": " + key + ": " + problem);
  }

  YAML::Node node_;
  std::string path_;
  const std::string& origin_;
};

constexpr int kIntMax = std::numeric_limits<int>::max();

Status ReadAddress(const MapReader& r, const std::string& key, std::string* out,
                   const std::string& origin, const std::string& path) {
  ICE_RETURN_IF_ERROR(r.String(key, out));
  if (out->find(':') == std::string::npos) {
    return InvalidArgumentError(origin + ": " + path + "." + key + ": expected HOST:PORT, got '" +
                                *out + "'");
  }
  return Status::Ok();
}

Status ReadDiscovery(const MapReader& r, WorkerDiscovery* out) {
  ICE_RETURN_IF_ERROR(r.CheckShape({"addresses", "dns"}));
  ICE_RETURN_IF_ERROR(r.StringList("addresses", &out->addresses));
  ICE_RETURN_IF_ERROR(r.String("dns", &out->dns));
  return Status::Ok();
}

Status ApplyOverride(const std::string& assignment, const std::string& origin, YAML::Node* root) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError(origin + ": override '" + assignment + "' is not KEY=VALUE");
  }
  std::string key = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  if (parts.empty() || parts.size() > 3) {
    return InvalidArgumentError(origin + ": override key '" + key + "' must be section.key");
  }
  YAML::Node parsed;
  ICE_RETURN_IF_ERROR(ParseYaml(value, origin + " (override " + key + ")", &parsed));
  if (!root->IsMap()) *root = YAML::Node(YAML::NodeType::Map);
  // yaml-cpp nodes are handles: walking with operator[] on copies edits the shared tree.
  YAML::Node node = *root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node child = node[parts[i]];
    if (!child.IsMap()) child = YAML::Node(YAML::NodeType::Map);
    node[parts[i]] = child;
    node.reset(child);
  }
  node[parts.back()] = parsed;
  return Status::Ok();
}

StatusOr<ClusterConfig> FromNode(const YAML::Node& root, const std::string& origin) {
  ClusterConfig c;
  MapReader top(root, "", origin);
  ICE_RETURN_IF_ERROR(top.CheckShape(
      {"model", "parallel", "cache", "limits", "router", "prefill", "decode", "ucx", "internal_tls"}));

  MapReader model = top.Sub("model");
  ICE_RETURN_IF_ERROR(model.CheckShape({"dir", "name"}));
  ICE_RETURN_IF_ERROR(model.String("dir", &c.model.dir));
  ICE_RETURN_IF_ERROR(model.String("name", &c.model.name));

  MapReader cache = top.Sub("cache");
  ICE_RETURN_IF_ERROR(
      cache.CheckShape({"page_size", "default_budget_pages", "dense_layers", "sink_pages", "window_pages", "dci_preset",
                        "dci_fov_fraction", "dci_fov_min", "dci_group_fov", "kv_dtype", "ice_group",
                        "device_cache_pages", "rest_estimate", "rest_cells"}));
  ICE_RETURN_IF_ERROR(cache.Number("page_size", &c.cache.page_size, 1, 4096));
  ICE_RETURN_IF_ERROR(cache.Number("default_budget_pages", &c.cache.default_budget_pages, 0, kIntMax));
  ICE_RETURN_IF_ERROR(cache.Number("dense_layers", &c.cache.dense_layers, 0, 4096));
  ICE_RETURN_IF_ERROR(cache.Number("sink_pages", &c.cache.sink_pages, 0, 4096));
  ICE_RETURN_IF_ERROR(cache.Number("window_pages", &c.cache.window_pages, 1, 4096));
  ICE_RETURN_IF_ERROR(cache.String("dci_preset", &c.cache.dci_preset));
  if (!kvstore::DciParamsPreset(c.cache.dci_preset).ok()) {
    return InvalidArgumentError(origin + ": cache.dci_preset: must be reference, tuned or flat, got '" +
                                c.cache.dci_preset + "'");
  }
  ICE_RETURN_IF_ERROR(cache.Number("dci_fov_fraction", &c.cache.dci_fov_fraction, 0.0, 1.0));
  ICE_RETURN_IF_ERROR(cache.Number("dci_fov_min", &c.cache.dci_fov_min, 0, 1 << 20));
  ICE_RETURN_IF_ERROR(cache.Number("dci_group_fov", &c.cache.dci_group_fov, 0.0, 64.0));
  ICE_RETURN_IF_ERROR(cache.String("kv_dtype", &c.cache.kv_dtype));
  if (c.cache.kv_dtype != "bf16" && c.cache.kv_dtype != "f16" && c.cache.kv_dtype != "f32") {
    return InvalidArgumentError(origin + ": cache.kv_dtype: must be bf16, f16 or f32, got '" + c.cache.kv_dtype +
                                "'");
  }
  ICE_RETURN_IF_ERROR(cache.Number("ice_group", &c.cache.ice_group, 1, 64));
  ICE_RETURN_IF_ERROR(cache.Number<int64_t>("device_cache_pages", &c.cache.device_cache_pages, 0, int64_t{1} << 31));
  ICE_RETURN_IF_ERROR(cache.Bool("rest_estimate", &c.cache.rest_estimate));
  ICE_RETURN_IF_ERROR(cache.Number("rest_cells", &c.cache.rest_cells, 0, 1 << 20));
  if (c.cache.default_budget_pages != 0 &&
      c.cache.default_budget_pages <= c.cache.sink_pages + c.cache.window_pages) {
    return InvalidArgumentError(origin + ": cache.default_budget_pages: must be 0 (full) or more than "
                                "sink_pages + window_pages = " +
                                std::to_string(c.cache.sink_pages + c.cache.window_pages));
  }

  MapReader limits = top.Sub("limits");
  ICE_RETURN_IF_ERROR(limits.CheckShape({"max_tokens", "max_prompt_tokens", "max_prompt_bytes", "max_stop_strings",
                                         "max_stop_string_bytes", "max_stop_token_ids", "max_message_bytes"}));
  ICE_RETURN_IF_ERROR(limits.Number("max_tokens", &c.limits.max_tokens, 1, kIntMax));
  ICE_RETURN_IF_ERROR(limits.Number("max_prompt_tokens", &c.limits.max_prompt_tokens, 1, kIntMax));
  ICE_RETURN_IF_ERROR(limits.Number<int64_t>("max_prompt_bytes", &c.limits.max_prompt_bytes, 1, int64_t{1} << 30));
  ICE_RETURN_IF_ERROR(limits.Number("max_stop_strings", &c.limits.max_stop_strings, 0, 1 << 16));
  ICE_RETURN_IF_ERROR(limits.Number("max_stop_string_bytes", &c.limits.max_stop_string_bytes, 1, 1 << 20));
  ICE_RETURN_IF_ERROR(limits.Number("max_stop_token_ids", &c.limits.max_stop_token_ids, 0, 1 << 16));
  ICE_RETURN_IF_ERROR(
      limits.Number<int64_t>("max_message_bytes", &c.limits.max_message_bytes, 1 << 16, int64_t{1} << 30));

  MapReader router = top.Sub("router");
  ICE_RETURN_IF_ERROR(router.CheckShape({"listen", "metrics_port", "prefill", "decode", "dns_refresh_seconds",
                                         "stats_refresh_seconds", "request_timeout_seconds",
                                         "kv_transfer_timeout_seconds", "max_waiting", "max_queue_wait_seconds",
                                         "max_streams", "http_port", "http_threads",
                                         "api_keys", "tls_cert_file", "tls_key_file", "max_migrations",
                                         "drain_seconds", "write_timeout_seconds", "retry_wait_seconds",
                                         "retry_attempts", "prefix_routing", "local_prefill_max_tokens"}));
  ICE_RETURN_IF_ERROR(ReadAddress(router, "listen", &c.router.listen, origin, "router"));
  ICE_RETURN_IF_ERROR(router.Number("metrics_port", &c.router.metrics_port, 0, 65535));
  ICE_RETURN_IF_ERROR(ReadDiscovery(router.Sub("prefill"), &c.router.prefill));
  ICE_RETURN_IF_ERROR(ReadDiscovery(router.Sub("decode"), &c.router.decode));
  ICE_RETURN_IF_ERROR(router.Number("dns_refresh_seconds", &c.router.dns_refresh_seconds, 0.1, 86400.0));
  ICE_RETURN_IF_ERROR(router.Number("stats_refresh_seconds", &c.router.stats_refresh_seconds, 0.01, 3600.0));
  ICE_RETURN_IF_ERROR(router.Number("request_timeout_seconds", &c.router.request_timeout_seconds, 0.001, 1e7));
  ICE_RETURN_IF_ERROR(
      router.Number("kv_transfer_timeout_seconds", &c.router.kv_transfer_timeout_seconds, 0.001, 1e5));
  ICE_RETURN_IF_ERROR(router.Number("max_waiting", &c.router.max_waiting, 0, 1 << 24));
  ICE_RETURN_IF_ERROR(router.Number("max_queue_wait_seconds", &c.router.max_queue_wait_seconds, 0.0, 86400.0));
  ICE_RETURN_IF_ERROR(router.Number("max_streams", &c.router.max_streams, 1, 1 << 24));
  ICE_RETURN_IF_ERROR(router.Number("write_timeout_seconds", &c.router.write_timeout_seconds, 0.0, 86400.0));
  ICE_RETURN_IF_ERROR(router.Number("http_port", &c.router.http_port, 0, 65535));
  ICE_RETURN_IF_ERROR(router.Number("http_threads", &c.router.http_threads, 1, 1 << 16));
  ICE_RETURN_IF_ERROR(router.StringList("api_keys", &c.router.api_keys));
  ICE_RETURN_IF_ERROR(router.Number("max_migrations", &c.router.max_migrations, 0, 64));
  ICE_RETURN_IF_ERROR(router.Number("drain_seconds", &c.router.drain_seconds, 0.0, 86400.0));
  ICE_RETURN_IF_ERROR(router.Number("retry_wait_seconds", &c.router.retry_wait_seconds, 0.0, 86400.0));
  ICE_RETURN_IF_ERROR(router.Number("retry_attempts", &c.router.retry_attempts, 1, 1024));
  ICE_RETURN_IF_ERROR(router.Bool("prefix_routing", &c.router.prefix_routing));
  ICE_RETURN_IF_ERROR(router.Number("local_prefill_max_tokens", &c.router.local_prefill_max_tokens, 0, 1 << 20));
  for (const auto& k : c.router.api_keys) {
    if (k.empty() || k.find_first_of(" \t\r\n") != std::string::npos) {
      return InvalidArgumentError(origin + ": router.api_keys: a key must be non-empty and hold no whitespace");
    }
  }
  ICE_RETURN_IF_ERROR(router.String("tls_cert_file", &c.router.tls_cert_file));
  ICE_RETURN_IF_ERROR(router.String("tls_key_file", &c.router.tls_key_file));
  if (c.router.tls_cert_file.empty() != c.router.tls_key_file.empty()) {
    return InvalidArgumentError(origin + ": router.tls_cert_file and router.tls_key_file go together (" +
                                (c.router.tls_cert_file.empty() ? "tls_key_file" : "tls_cert_file") +
                                " is set, the other is not)");
  }

  MapReader prefill = top.Sub("prefill");
  ICE_RETURN_IF_ERROR(prefill.CheckShape(
      {"listen", "metrics_port", "threads", "max_batch_tokens", "overlap_tree_build", "max_queued_requests",
       "health_stall_seconds", "device", "drain_seconds", "devices"}));
  ICE_RETURN_IF_ERROR(ReadAddress(prefill, "listen", &c.prefill.listen, origin, "prefill"));
  ICE_RETURN_IF_ERROR(prefill.Number("metrics_port", &c.prefill.metrics_port, 0, 65535));
  ICE_RETURN_IF_ERROR(prefill.Number("threads", &c.prefill.threads, 0, 4096));
  ICE_RETURN_IF_ERROR(prefill.Number("max_batch_tokens", &c.prefill.max_batch_tokens, 1, kIntMax));
  ICE_RETURN_IF_ERROR(prefill.Bool("overlap_tree_build", &c.prefill.overlap_tree_build));
  ICE_RETURN_IF_ERROR(prefill.Number("max_queued_requests", &c.prefill.max_queued_requests, 1, 1 << 24));
  ICE_RETURN_IF_ERROR(prefill.Number("health_stall_seconds", &c.prefill.health_stall_seconds, 0.001, 86400.0));
  ICE_RETURN_IF_ERROR(prefill.String("device", &c.prefill.device));
  ICE_RETURN_IF_ERROR(prefill.Number("drain_seconds", &c.prefill.drain_seconds, 0.0, 86400.0));
  if (auto d = kernels::ParseDevice(c.prefill.device); !d.ok()) {
    return InvalidArgumentError(origin + ": prefill.device: " + d.status().message());
  }
  ICE_RETURN_IF_ERROR(prefill.StringList("devices", &c.prefill.devices));

  MapReader decode = top.Sub("decode");
  ICE_RETURN_IF_ERROR(decode.CheckShape({"listen", "metrics_port", "threads", "pool_pages", "max_sequences",
                                         "health_stall_seconds", "drain_seconds", "device", "devices",
                                         "prefix_cache"}));
  ICE_RETURN_IF_ERROR(ReadAddress(decode, "listen", &c.decode.listen, origin, "decode"));
  ICE_RETURN_IF_ERROR(decode.Number("metrics_port", &c.decode.metrics_port, 0, 65535));
  ICE_RETURN_IF_ERROR(decode.Number("threads", &c.decode.threads, 0, 4096));
  ICE_RETURN_IF_ERROR(decode.Number<int64_t>("pool_pages", &c.decode.pool_pages, 1, int64_t{1} << 40));
  ICE_RETURN_IF_ERROR(decode.Number("max_sequences", &c.decode.max_sequences, 1, 1 << 20));
  ICE_RETURN_IF_ERROR(decode.Bool("prefix_cache", &c.decode.prefix_cache));
  ICE_RETURN_IF_ERROR(decode.Number("health_stall_seconds", &c.decode.health_stall_seconds, 0.001, 86400.0));
  ICE_RETURN_IF_ERROR(decode.Number("drain_seconds", &c.decode.drain_seconds, 0.0, 86400.0));
  ICE_RETURN_IF_ERROR(decode.String("device", &c.decode.device));
  if (auto d = kernels::ParseDevice(c.decode.device); !d.ok()) {
    return InvalidArgumentError(origin + ": decode.device: " + d.status().message());
  }
  ICE_RETURN_IF_ERROR(decode.StringList("devices", &c.decode.devices));

  MapReader ucx = top.Sub("ucx");
  ICE_RETURN_IF_ERROR(ucx.CheckShape(
      {"tls", "net_devices", "transfer_timeout_seconds", "max_segment_bytes", "peer_failure_detection"}));
  ICE_RETURN_IF_ERROR(ucx.String("tls", &c.ucx.tls));
  ICE_RETURN_IF_ERROR(ucx.String("net_devices", &c.ucx.net_devices));
  ICE_RETURN_IF_ERROR(ucx.Number("transfer_timeout_seconds", &c.ucx.transfer_timeout_seconds, 0.001, 1e5));
  ICE_RETURN_IF_ERROR(ucx.Number<int64_t>("max_segment_bytes", &c.ucx.max_segment_bytes, 1, int64_t{1} << 30));
  ICE_RETURN_IF_ERROR(ucx.Bool("peer_failure_detection", &c.ucx.peer_failure_detection));

  MapReader parallel = top.Sub("parallel");
  ICE_RETURN_IF_ERROR(parallel.CheckShape({"tensor_parallel_size"}));
  ICE_RETURN_IF_ERROR(parallel.Number("tensor_parallel_size", &c.parallel.tensor_parallel_size, 1, 1024));

  MapReader tls = top.Sub("internal_tls");
  ICE_RETURN_IF_ERROR(tls.CheckShape({"ca_file", "cert_file", "key_file", "server_name"}));
  ICE_RETURN_IF_ERROR(tls.String("ca_file", &c.internal_tls.ca_file));
  ICE_RETURN_IF_ERROR(tls.String("cert_file", &c.internal_tls.cert_file));
  ICE_RETURN_IF_ERROR(tls.String("key_file", &c.internal_tls.key_file));
  ICE_RETURN_IF_ERROR(tls.String("server_name", &c.internal_tls.server_name));
  const bool any = !c.internal_tls.ca_file.empty() || !c.internal_tls.cert_file.empty() ||
                   !c.internal_tls.key_file.empty();
  const bool all = !c.internal_tls.ca_file.empty() && !c.internal_tls.cert_file.empty() &&
                   !c.internal_tls.key_file.empty();
  if (any && !all) {
    return InvalidArgumentError(origin + ": internal_tls needs ca_file, cert_file and key_file together (mutual TLS)");
  }
  return c;
}

}  // namespace

StatusOr<ClusterConfig> ParseClusterConfig(const std::string& yaml_text, const std::string& origin,
                                           const std::vector<std::string>& overrides) {
  YAML::Node root;
  ICE_RETURN_IF_ERROR(ParseYaml(yaml_text, origin, &root));
  try {
    for (const auto& o : overrides) ICE_RETURN_IF_ERROR(ApplyOverride(o, origin, &root));
    return FromNode(root, origin);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(origin + ": " + e.msg);
  }
}

StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return ParseClusterConfig("", "<defaults>", overrides);
  YAML::Node root;
  ICE_RETURN_IF_ERROR(LoadYamlFile(path, &root));
  try {
    for (const auto& o : overrides) ICE_RETURN_IF_ERROR(ApplyOverride(o, path, &root));
    return FromNode(root, path);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(path + ": " + e.msg);
  }
}

StatusOr<ClusterConfig> ConfigFromCommandLine(int argc, char** argv, const std::string& section) {
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<std::string> api_keys;  // --api-key: kept out of the YAML overrides (a key may hold YAML syntax)
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    auto take = [&](const char* flag) -> bool {
      size_t n = std::strlen(flag);
      if (arg == flag && i + 1 < argc) {
        value = argv[++i];
        return true;
      }
      if (arg.size() > n && arg.compare(0, n, flag) == 0 && arg[n] == '=') {
        value = arg.substr(n + 1);
        return true;
      }
      return false;
    };
    if (take("--config")) {
      config_path = value;
    } else if (take("--set")) {
      overrides.push_back(value);
    } else if (take("--model")) {
      overrides.push_back("model.dir=" + value);
    } else if (take("--listen")) {
      overrides.push_back(section + ".listen=" + value);
    } else if (take("--metrics-port")) {
      overrides.push_back(section + ".metrics_port=" + value);
    } else if (take("--api-key")) {
      if (section != "router") return InvalidArgumentError("--api-key: only the router checks API keys");
      api_keys.push_back(value);
    } else if (take("--http-port")) {
      if (section != "router") return InvalidArgumentError("--http-port: only the router serves HTTP");
      overrides.push_back("router.http_port=" + value);
    } else if (take("--kv-dtype")) {
      overrides.push_back("cache.kv_dtype=" + value);
    } else if (take("--device")) {
      if (section == "router") return InvalidArgumentError("--device: the router runs no model");
      overrides.push_back(section + ".device=" + value);
    } else {
      return InvalidArgumentError("unknown or incomplete option '" + arg +
                                  "' (options: --config FILE, --set SECTION.KEY=VALUE, --model DIR, "
                                  "--listen HOST:PORT, --metrics-port PORT, --http-port PORT (router), --api-key KEY (router), --kv-dtype bf16|f16|f32, --device auto|cpu|cuda:N)");
    }
  }
  ICE_ASSIGN_OR_RETURN(ClusterConfig c, LoadClusterConfig(config_path, overrides));
  for (const auto& k : api_keys) {
    if (k.empty() || k.find_first_of(" \t\r\n") != std::string::npos) {
      return InvalidArgumentError("--api-key: a key must be non-empty and hold no whitespace");
    }
    c.router.api_keys.push_back(k);
  }
  return c;
}

std::string ClusterConfigToYaml(const ClusterConfig& c) {
  YAML::Emitter out;
  auto discovery = [&](const char* name, const WorkerDiscovery& d) {
    out << YAML::Key << name << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "addresses" << YAML::Value << YAML::Flow << d.addresses;
    out << YAML::Key << "dns" << YAML::Value << d.dns << YAML::EndMap;
  };
  out << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap << YAML::Key << "dir" << YAML::Value
      << c.model.dir;
  if (!c.model.name.empty()) out << YAML::Key << "name" << YAML::Value << c.model.name;
  out << YAML::EndMap;
  out << YAML::Key << "cache" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "page_size" << YAML::Value << c.cache.page_size;
  out << YAML::Key << "default_budget_pages" << YAML::Value << c.cache.default_budget_pages;
  out << YAML::Key << "dense_layers" << YAML::Value << c.cache.dense_layers;
  out << YAML::Key << "sink_pages" << YAML::Value << c.cache.sink_pages;
  out << YAML::Key << "window_pages" << YAML::Value << c.cache.window_pages;
  out << YAML::Key << "dci_preset" << YAML::Value << c.cache.dci_preset;
  out << YAML::Key << "dci_fov_fraction" << YAML::Value << c.cache.dci_fov_fraction;
  out << YAML::Key << "dci_fov_min" << YAML::Value << c.cache.dci_fov_min;
  out << YAML::Key << "dci_group_fov" << YAML::Value << c.cache.dci_group_fov;
  out << YAML::Key << "kv_dtype" << YAML::Value << c.cache.kv_dtype;
  out << YAML::Key << "ice_group" << YAML::Value << c.cache.ice_group;
  out << YAML::Key << "device_cache_pages" << YAML::Value << c.cache.device_cache_pages;
  out << YAML::Key << "rest_estimate" << YAML::Value << c.cache.rest_estimate;
  out << YAML::Key << "rest_cells" << YAML::Value << c.cache.rest_cells << YAML::EndMap;
  out << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "max_tokens" << YAML::Value << c.limits.max_tokens;
  out << YAML::Key << "max_prompt_tokens" << YAML::Value << c.limits.max_prompt_tokens;
  out << YAML::Key << "max_prompt_bytes" << YAML::Value << c.limits.max_prompt_bytes;
  out << YAML::Key << "max_stop_strings" << YAML::Value << c.limits.max_stop_strings;
  out << YAML::Key << "max_stop_string_bytes" << YAML::Value << c.limits.max_stop_string_bytes;
  out << YAML::Key << "max_stop_token_ids" << YAML::Value << c.limits.max_stop_token_ids;
  out << YAML::Key << "max_message_bytes" << YAML::Value << c.limits.max_message_bytes << YAML::EndMap;
  out << YAML::Key << "router" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "listen" << YAML::Value << c.router.listen;
  out << YAML::Key << "metrics_port" << YAML::Value << c.router.metrics_port;
  discovery("prefill", c.router.prefill);
  discovery("decode", c.router.decode);
  out << YAML::Key << "dns_refresh_seconds" << YAML::Value << c.router.dns_refresh_seconds;
  out << YAML::Key << "stats_refresh_seconds" << YAML::Value << c.router.stats_refresh_seconds;
  out << YAML::Key << "request_timeout_seconds" << YAML::Value << c.router.request_timeout_seconds;
  out << YAML::Key << "kv_transfer_timeout_seconds" << YAML::Value << c.router.kv_transfer_timeout_seconds;
  out << YAML::Key << "max_waiting" << YAML::Value << c.router.max_waiting;
  out << YAML::Key << "max_queue_wait_seconds" << YAML::Value << c.router.max_queue_wait_seconds;
  out << YAML::Key << "max_streams" << YAML::Value << c.router.max_streams;
  out << YAML::Key << "write_timeout_seconds" << YAML::Value << c.router.write_timeout_seconds;
  out << YAML::Key << "http_port" << YAML::Value << c.router.http_port;
  out << YAML::Key << "http_threads" << YAML::Value << c.router.http_threads;
  out << YAML::Key << "api_keys" << YAML::Value << YAML::Flow << c.router.api_keys;
  out << YAML::Key << "tls_cert_file" << YAML::Value << c.router.tls_cert_file;
  out << YAML::Key << "tls_key_file" << YAML::Value << c.router.tls_key_file;
  out << YAML::Key << "max_migrations" << YAML::Value << c.router.max_migrations;
  out << YAML::Key << "drain_seconds" << YAML::Value << c.router.drain_seconds;
  out << YAML::Key << "retry_wait_seconds" << YAML::Value << c.router.retry_wait_seconds;
  out << YAML::Key << "retry_attempts" << YAML::Value << c.router.retry_attempts;
  out << YAML::Key << "prefix_routing" << YAML::Value << c.router.prefix_routing;
  out << YAML::Key << "local_prefill_max_tokens" << YAML::Value << c.router.local_prefill_max_tokens;
  out << YAML::EndMap;
  out << YAML::Key << "prefill" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "listen" << YAML::Value << c.prefill.listen;
  out << YAML::Key << "metrics_port" << YAML::Value << c.prefill.metrics_port;
  out << YAML::Key << "threads" << YAML::Value << c.prefill.threads;
  out << YAML::Key << "max_batch_tokens" << YAML::Value << c.prefill.max_batch_tokens;
  out << YAML::Key << "overlap_tree_build" << YAML::Value << c.prefill.overlap_tree_build;
  out << YAML::Key << "max_queued_requests" << YAML::Value << c.prefill.max_queued_requests;
  out << YAML::Key << "health_stall_seconds" << YAML::Value << c.prefill.health_stall_seconds;
  out << YAML::Key << "device" << YAML::Value << c.prefill.device;
  out << YAML::Key << "drain_seconds" << YAML::Value << c.prefill.drain_seconds;
  out << YAML::Key << "devices" << YAML::Value << YAML::Flow << c.prefill.devices << YAML::EndMap;
  out << YAML::Key << "decode" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "listen" << YAML::Value << c.decode.listen;
  out << YAML::Key << "metrics_port" << YAML::Value << c.decode.metrics_port;
  out << YAML::Key << "threads" << YAML::Value << c.decode.threads;
  out << YAML::Key << "pool_pages" << YAML::Value << c.decode.pool_pages;
  out << YAML::Key << "max_sequences" << YAML::Value << c.decode.max_sequences;
  out << YAML::Key << "prefix_cache" << YAML::Value << c.decode.prefix_cache;
  out << YAML::Key << "health_stall_seconds" << YAML::Value << c.decode.health_stall_seconds;
  out << YAML::Key << "drain_seconds" << YAML::Value << c.decode.drain_seconds;
  out << YAML::Key << "device" << YAML::Value << c.decode.device;
  out << YAML::Key << "devices" << YAML::Value << YAML::Flow << c.decode.devices << YAML::EndMap;
  out << YAML::Key << "ucx" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "tls" << YAML::Value << c.ucx.tls;
  out << YAML::Key << "net_devices" << YAML::Value << c.ucx.net_devices;
  out << YAML::Key << "transfer_timeout_seconds" << YAML::Value << c.ucx.transfer_timeout_seconds;
  out << YAML::Key << "max_segment_bytes" << YAML::Value << c.ucx.max_segment_bytes;
  out << YAML::Key << "peer_failure_detection" << YAML::Value << c.ucx.peer_failure_detection;
  out << YAML::EndMap;
  out << YAML::Key << "parallel" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "tensor_parallel_size" << YAML::Value << c.parallel.tensor_parallel_size;
  out << YAML::EndMap;
  if (c.internal_tls.enabled() || !c.internal_tls.server_name.empty()) {
    out << YAML::Key << "internal_tls" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "ca_file" << YAML::Value << c.internal_tls.ca_file;
    out << YAML::Key << "cert_file" << YAML::Value << c.internal_tls.cert_file;
    out << YAML::Key << "key_file" << YAML::Value << c.internal_tls.key_file;
    out << YAML::Key << "server_name" << YAML::Value << c.internal_tls.server_name;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

StatusOr<std::vector<kernels::Device>> RankDevices(const std::vector<std::string>& devices, int tensor_parallel_size,
                                                   const std::string& role) {
  std::vector<kernels::Device> out;
  if (devices.empty()) return out;
  if (static_cast<int>(devices.size()) != tensor_parallel_size) {
    return InvalidArgumentError(role + ".devices lists " + std::to_string(devices.size()) +
                                " devices for parallel.tensor_parallel_size " + std::to_string(tensor_parallel_size) +
                                " (one per rank, or leave it empty)");
  }
  for (const auto& d : devices) {
    auto parsed = kernels::ParseDevice(d);
    if (!parsed.ok()) return InvalidArgumentError(role + ".devices: " + parsed.status().message());
    out.push_back(*parsed);
  }
  return out;
}

}  // namespace icecache::cluster
