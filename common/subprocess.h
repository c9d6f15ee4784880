// Starting and reaping child processes: `icecache cluster`'s children, the soak bench's workers,
// the cluster tests' processes.
//
// SpawnProcess prepares everything (argv, the environment, the log file) before fork and calls
// only async-signal-safe functions in the child (dup2, sigprocmask, signal, execve, write,
// _exit), so it is safe from a multi-threaded parent: a lock another thread held at fork time
// (malloc's, the environment's) is never taken in the child.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace icecache {

struct SpawnOptions {
  // stdout and stderr of the child go to this file ("" keeps the parent's); created 0644.
  std::string log_path;
  bool append_log = false;  // false truncates the file
  // Set in the child's environment on top of the parent's (a name given twice: the last wins).
  std::vector<std::pair<std::string, std::string>> env;
};

// Starts argv[0] (a path; no PATH search) with argv. In the child SIGINT and SIGTERM are back to
// their defaults and no signal is blocked, whatever the parent set. INVALID_ARGUMENT for an empty
// argv; UNAVAILABLE when the log file cannot be opened or fork fails. When exec fails the child
// writes "cannot run ARGV0" to its stderr (the log) and exits 127.
StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv, const SpawnOptions& options = {});

// Waits for child `pid` (retrying on EINTR): its exit code, or 128 + the signal that ended it;
// -1 when `pid` is not a child of this process.
int WaitExit(pid_t pid);

}  // namespace icecache
