// The shared main() of icecache-router, icecache-prefill and icecache-decode: parses the config
// from the command line, starts the server, and stops it cleanly on SIGINT/SIGTERM.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"
#include "serving/cluster_config.h"

namespace icecache::cluster {

struct ServingProcess {
  std::function<void()> wait;      // blocks until the server stops
  std::function<void()> shutdown;  // thread-safe, idempotent
};

using StartFn = std::function<StatusOr<ServingProcess>(const ClusterConfig&)>;

// Returns the process exit code: 0 after a signal-initiated shutdown (or when the server stopped
// by itself), 1 when starting failed, 2 for a bad command line. `section` is "router", "prefill"
// or "decode". SIGINT and SIGTERM get a handler (installed before `start`) that only wakes a
// signal thread, which calls `shutdown`: the process drains and exits 0 whichever thread the
// kernel hands the signal to, including threads that shared libraries started before main.
// Call once per process.
int WorkerMain(int argc, char** argv, const std::string& section, const StartFn& start);

}  // namespace icecache::cluster
