// monitoring/: the Prometheus config and alert rules pass promtool; the Grafana dashboard only
// queries metrics the services really export; a real Prometheus server scrapes a running cluster.
#include <gtest/gtest.h>

#include "tests/cluster/free_ports.h"
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
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
  }
  int base_ = 0;
  std::unique_ptr<LoopbackCluster> cluster_;
};

TEST_F(MonitoringCluster, DashboardQueriesExportedMetrics) {
  std::set<std::string> exported;
  std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{|\s))");
  // One refused request, so that the error counter family has a sample.
  router::RemoteGenerateOptions bad;
  bad.router = cluster_->router->address();
  bad.prompt_ids = {1};
  bad.max_tokens = 0;
  EXPECT_EQ(router::RunRemoteGenerate(bad, [](const router::RemoteChunk&) { return true; }).code(),
            StatusCode::kInvalidArgument);
  // Metrics are refreshed every 0.5 s on the decode worker; give it a moment.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  std::string router_text;
  for (int port = base_; port < base_ + 3; ++port) {
    std::string text = HttpGet(port, "/metrics");
    ASSERT_FALSE(text.empty()) << "no /metrics on port " << port;
    if (port == base_) router_text = text;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_search(line, m, sample)) exported.insert(m[1]);
    }
  }
  EXPECT_NE(router_text.find("icecache_time_to_first_token_seconds_count 1"), std::string::npos) << router_text;
  EXPECT_NE(router_text.find("icecache_generation_tokens_total 5"), std::string::npos);
  EXPECT_NE(router_text.find("icecache_request_success_total{finished_reason=\"length\"} 1"), std::string::npos);

  std::ifstream f(kMonitoring + "grafana/icecache-dashboard.json");
  auto dash = nlohmann::json::parse(f);
  std::regex metric(R"(icecache_[a-z0-9_]+)");
  int checked = 0;
  for (const auto& panel : dash["panels"]) {
    for (const auto& target : panel["targets"]) {
      std::string expr = target["expr"];
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), metric); it != std::sregex_iterator(); ++it) {
        EXPECT_TRUE(exported.count(it->str())) << "dashboard panel '" << panel["title"] << "' queries " << it->str()
                                               << ", which no service exports";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10);
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
  pid_t prom = fork();
  if (prom == 0) {
    std::string cfg = "--config.file=" + dir + "/prometheus.yml";
    std::string tsdb = "--storage.tsdb.path=" + dir + "/data";
    std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(prom_port);
    freopen("/dev/null", "w", stderr);
    execlp("prometheus", "prometheus", cfg.c_str(), tsdb.c_str(), listen.c_str(), nullptr);
    _exit(127);
  }
  std::string body;
  bool found = false;
  for (int i = 0; i < 300 && !found; ++i) {  // up to 30 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    body = HttpGet(prom_port, "/api/v1/query?query=icecache_generation_tokens_total");
    found = body.find("\"result\":[{") != std::string::npos;
  }
  kill(prom, SIGTERM);
  waitpid(prom, nullptr, 0);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(found) << body;
}

}  // namespace
}  // namespace icecache::testing
