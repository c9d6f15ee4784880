#include "common/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

extern char** environ;

namespace icecache {

StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty() || argv[0].empty()) return InvalidArgumentError("SpawnProcess: no program to run");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // The environment: the parent's, minus the names options.env sets, then options.env.
  std::vector<std::string> set;
  for (const auto& [name, value] : options.env) {
    std::erase_if(set, [&](const std::string& e) { return e.compare(0, name.size() + 1, name + "=") == 0; });
    set.push_back(name + "=" + value);
  }
  std::vector<char*> envp;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    bool replaced = false;
    for (const auto& [name, value] : options.env) {
      replaced = replaced || (std::strncmp(*e, name.c_str(), name.size()) == 0 && (*e)[name.size()] == '=');
    }
    if (!replaced) envp.push_back(*e);
  }
  for (auto& e : set) envp.push_back(e.data());
  envp.push_back(nullptr);

  int log_fd = -1;
  if (!options.log_path.empty()) {
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.append_log ? O_APPEND : O_TRUNC);
    log_fd = open(options.log_path.c_str(), flags, 0644);
    if (log_fd < 0) {
      return UnavailableError("cannot open the log file " + options.log_path + ": " + std::strerror(errno));
    }
  }
  const std::string exec_failed = "cannot run " + argv[0] + "\n";

  const pid_t pid = fork();
  if (pid == 0) {
    if (log_fd >= 0) {  // dup2 clears O_CLOEXEC on the copies
      dup2(log_fd, 1);
      dup2(log_fd, 2);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(args[0], args.data(), envp.data());
    ssize_t ignored = write(2, exec_failed.data(), exec_failed.size());
    (void)ignored;
    _exit(127);
  }
  const int fork_errno = errno;
  if (log_fd >= 0) close(log_fd);
  if (pid < 0) return UnavailableError(std::string("cannot start ") + argv[0] + ": fork: " + std::strerror(fork_errno));
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace icecache
