// monitoring/: the Prometheus config and alert rules pass promtool; the Grafana dashboard only
// queries metrics the services really export; a real Prometheus server scrapes a running cluster.
#include <gtest/gtest.h>

#include "tests/cluster/free_ports.h"
#include "tests/cluster/process_util.h"
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "client/client.h"
#include "tests/cluster/cluster_fixture.h"

namespace icecache::testing {
namespace {

const std::string kMonitoring = std::string(ICECACHE_SOURCE_DIR) + "/monitoring/";

int Shell(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool HaveTool(const std::string& name) { return Shell("command -v " + name + " >/dev/null 2>&1") == 0; }

// Plain HTTP/1.0 GET on 127.0.0.1; returns the body ("" on failure).
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

std::string UrlEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

int FreePortRange(int n) { return testing::FreePortRange(n, 104729u); }

TEST(Monitoring, PromtoolAcceptsConfigAndRules) {
  if (!HaveTool("promtool")) GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  EXPECT_EQ(Shell("cd " + kMonitoring + " && promtool check config prometheus.yml >/dev/null"), 0);
  EXPECT_EQ(Shell("promtool check rules " + kMonitoring + "alerts.yml >/dev/null"), 0);
  // promtool does fail on a broken rule (so the check above means something).
  std::string bad = ::testing::TempDir() + "/bad_rules.yml";
  std::ofstream(bad) << "groups:\n  - name: x\n    rules:\n      - alert: A\n        expr: rate(\n";
  EXPECT_NE(Shell("promtool check rules " + bad + " >/dev/null 2>&1"), 0);
}

class MonitoringCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = FreePortRange(3);
    ASSERT_GT(base_, 0);
    cluster_ = LoopbackCluster::Start(::testing::TempDir() + "/icecache_monitoring_model", 1, 1, "tcp,sm,self", true,
                                      base_);
    ASSERT_NE(cluster_, nullptr);
    router::RemoteGenerateOptions o;
    o.router = cluster_->router->address();
    o.prompt_ids = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    o.max_tokens = 5;
    o.ignore_eos = true;
    o.budget_pages = 4;
    ASSERT_TRUE(router::RunRemoteGenerate(o, [](const router::RemoteChunk&) { return true; }).ok());
    // One refused request, so that the error counter family has a sample.
    router::RemoteGenerateOptions bad;
    bad.router = cluster_->router->address();
    bad.prompt_ids = {1};
    bad.max_tokens = 0;
    EXPECT_EQ(router::RunRemoteGenerate(bad, [](const router::RemoteChunk&) { return true; }).code(),
              StatusCode::kInvalidArgument);
  }
  // The dashboard's PromQL expressions, each with the panel title.
  static std::vector<std::pair<std::string, std::string>> DashboardExprs() {
    std::ifstream f(kMonitoring + "grafana/icecache-dashboard.json");
    auto dash = nlohmann::json::parse(f);
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& panel : dash["panels"]) {
      for (const auto& target : panel["targets"]) out.emplace_back(panel["title"], target["expr"]);
    }
    return out;
  }
  int base_ = 0;
  std::unique_ptr<LoopbackCluster> cluster_;
};

TEST_F(MonitoringCluster, EveryProcessLabelsItsSeriesAndNoFamilyIsShared) {
  // Metrics are refreshed every 0.5 s on the decode worker; give it a moment.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const char* kComponents[] = {"router", "prefill", "decode"};
  const std::string model_name = "icecache_monitoring_model";  // the model directory's name
  std::regex sample(R"(^(icecache_[a-zA-Z0-9_:]*)\{([^}]*)\}\s)");
  std::map<std::string, std::string> owner;  // family -> the component exporting it
  std::string router_text;
  for (int k = 0; k < 3; ++k) {
    std::string text = HttpGet(base_ + k, "/metrics");
    ASSERT_FALSE(text.empty()) << "no /metrics on port " << base_ + k;
    if (k == 0) router_text = text;
    std::istringstream in(text);
    int samples = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("icecache_", 0) != 0) continue;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(line, m, sample)) << kComponents[k] << " exports a series without labels: " << line;
      std::string labels = m[2];
      EXPECT_NE(labels.find(std::string("component=\"") + kComponents[k] + "\""), std::string::npos) << line;
      EXPECT_NE(labels.find("model_name=\"" + model_name + "\""), std::string::npos) << line;
      std::string family = std::regex_replace(std::string(m[1]), std::regex("_(bucket|sum|count)$"), "");
      auto [it, inserted] = owner.emplace(family, kComponents[k]);
      // Each worker counts its own restarts (serving/metric_families.h): no event counted twice.
      if (family == "icecache_worker_restarts_total" && k > 0) continue;
      EXPECT_EQ(it->second, kComponents[k]) << family << " is exported by both " << it->second << " and "
                                            << kComponents[k] << ": a sum over targets would count it twice";
      ++samples;
    }
    EXPECT_GT(samples, 3) << kComponents[k];
  }
  auto has = [&](const std::string& pattern) { return std::regex_search(router_text, std::regex(pattern)); };
  EXPECT_TRUE(has(R"(icecache_time_to_first_token_seconds_count\{[^}]*\} 1\n)")) << router_text;
  EXPECT_TRUE(has(R"(icecache_generation_tokens_total\{[^}]*\} 5\n)")) << router_text;
  EXPECT_TRUE(has(R"(icecache_request_success_total\{[^}]*finished_reason="length"[^}]*\} 1\n)")) << router_text;
  // The vLLM-style request families, one sample each for the one served request.
  EXPECT_TRUE(has(R"(icecache_request_queue_time_seconds_count\{[^}]*\} 1\n)")) << router_text;
  EXPECT_TRUE(has(R"(icecache_request_prefill_time_seconds_count\{[^}]*\} 1\n)")) << router_text;
  EXPECT_TRUE(has(R"(icecache_request_decode_time_seconds_count\{[^}]*\} 1\n)")) << router_text;
  EXPECT_TRUE(has(R"(icecache_request_prompt_tokens_sum\{[^}]*\} 9\n)")) << router_text;
  EXPECT_TRUE(has(R"(icecache_request_generation_tokens_sum\{[^}]*\} 5\n)")) << router_text;

  // Every metric a dashboard panel queries is exported by some process.
  std::regex metric(R"(icecache_[a-z0-9_]+)");
  int checked = 0;
  for (const auto& [title, expr] : DashboardExprs()) {
    for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric); it != std::sregex_iterator(); ++it) {
      std::string family = std::regex_replace(it->str(), std::regex("_bucket$"), "");
      EXPECT_TRUE(owner.count(family)) << "dashboard panel '" << title << "' queries " << it->str()
                                       << ", which no service exports";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST_F(MonitoringCluster, PrometheusScrapesTheCluster) {
  if (!HaveTool("prometheus")) GTEST_SKIP() << "prometheus not installed";
  int prom_port = FreePortRange(1);
  ASSERT_GT(prom_port, 0);
  std::string dir = ::testing::TempDir() + "/icecache_prom_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/prometheus.yml") << "global: {scrape_interval: 1s}\n"
                                            "scrape_configs:\n  - job_name: icecache\n    static_configs:\n"
                                            "      - targets: ['127.0.0.1:"
                                         << base_ << "', '127.0.0.1:" << base_ + 1 << "', '127.0.0.1:" << base_ + 2
                                         << "']\n";
  // Prometheus's path resolved here: SpawnProcess runs a path, with its output in a log file.
  std::string prom_bin;
  for (const char* d : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    const std::filesystem::path candidate = std::filesystem::path(d) / "prometheus";
    if (prom_bin.empty() && access(candidate.c_str(), X_OK) == 0) prom_bin = candidate.string();
  }
  ASSERT_FALSE(prom_bin.empty()) << "prometheus is on PATH but not in /usr/bin, /usr/local/bin or /bin";
  const pid_t prom = Spawn({prom_bin, "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
                            "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                           dir + "/prometheus.log");
  ASSERT_GT(prom, 0);
  // The scrape config above has no relabelling: the component label comes from the processes.
  std::string body;
  bool found = false;
  for (int i = 0; i < 300 && !found; ++i) {  // up to 30 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    body = HttpGet(prom_port, "/api/v1/query?query=" + UrlEncode("icecache_generation_tokens_total{component=\"router\"}"));
    found = body.find("\"result\":[{") != std::string::npos;
  }
  EXPECT_TRUE(found) << body;
  // A second request after the first scrapes, then enough scrapes (1 s apart) for rate() over 30 s.
  router::RemoteGenerateOptions o;
  o.router = cluster_->router->address();
  o.prompt_ids = {5, 6, 7, 8, 9, 10, 11};
  o.max_tokens = 4;
  o.ignore_eos = true;
  o.budget_pages = 4;
  ASSERT_TRUE(router::RunRemoteGenerate(o, [](const router::RemoteChunk&) { return true; }).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  int evaluated = 0;
  for (const auto& [title, expr] : DashboardExprs()) {
    std::string e = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "30s");
    std::string r = HttpGet(prom_port, "/api/v1/query?query=" + UrlEncode(e));
    EXPECT_NE(r.find("\"status\":\"success\""), std::string::npos) << "panel '" << title << "': " << e << " -> " << r;
    EXPECT_NE(r.find("\"result\":[{"), std::string::npos)
        << "panel '" << title << "': no data for " << e << " -> " << r;
    ++evaluated;
  }
  EXPECT_GT(evaluated, 20);
  kill(prom, SIGTERM);
  WaitExit(prom);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace icecache::testing
