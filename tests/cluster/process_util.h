// Helpers for tests that run the cluster as real processes (icecache-router, -prefill, -decode
// fork/exec'd on loopback): spawning with a log file, reaping, and reading a /metrics page.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace icecache::testing {

// Starts `args` (args[0] = the binary's path) with stdout and stderr in `log` and OMP_WAIT_POLICY
// passive, plus the environment variables `env` (name, value).
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    setenv("OMP_WAIT_POLICY", "passive", 1);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for `pid`: its exit code, or 128 + the signal that ended it (-1 when it is not a child).
inline int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
