// Helpers for tests that run the cluster as real processes (icecache-router, -prefill, -decode
// fork/exec'd on loopback): spawning with a log file and reading a /metrics page.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/subprocess.h"
#include "model/random_checkpoint.h"

namespace icecache::testing {

// Starts `args` (args[0] = the binary's path; common/subprocess.h) with stdout and stderr in
// `log` ("" keeps the test's own) and OMP_WAIT_POLICY passive, plus the environment variables
// `env` (name, value). -1 when it cannot be started. Reap it with icecache::WaitExit.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log = "",
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
  SpawnOptions o;
  o.log_path = log;
  o.env = {{"OMP_WAIT_POLICY", "passive"}};
  o.env.insert(o.env.end(), env.begin(), env.end());
  StatusOr<pid_t> pid = SpawnProcess(args, o);
  return pid.ok() ? *pid : -1;
}

// A file's whole contents ("" when it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The small random f32 Llama the process tests serve (4 layers, 4 heads over 2 kv heads, hidden
// 64, vocab 320), written once to TempDir()/name; its directory.
inline std::string SmallRandomModel(const std::string& name, uint64_t seed) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  model::RandomModelSpec spec;
  spec.hidden = 64;
  spec.layers = 4;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.vocab = 320;
  spec.max_position = 4096;
  spec.dtype = kernels::DType::kF32;
  spec.seed = seed;
  EXPECT_TRUE(model::EnsureRandomCheckpoint(dir, spec).ok());
  return dir;
}

// The body of GET http://127.0.0.1:port/metrics ("" when it cannot be read).
inline std::string Scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The value of the first series of family `name` ("NAME{...} VALUE" or "NAME VALUE"; -1 when
// absent).
inline double MetricValue(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + name.size();
    if (line_start && after < text.size() && (text[after] == '{' || text[after] == ' ')) {
      const size_t end = text.find('\n', after);
      const std::string line = text.substr(after, end - after);
      return std::atof(line.substr(line.rfind(' ') + 1).c_str());
    }
    at = after;
  }
  return -1;
}

}  // namespace icecache::testing
