#include "serving/worker_main.h"

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "common/logging.h"

namespace icecache::cluster {

int WorkerMain(int argc, char** argv, const std::string& section, const StartFn& start) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fprintf(stderr,
                   "usage: %s [--config FILE] [--model DIR] [--listen HOST:PORT] [--metrics-port PORT]\n"
                   "          [--set SECTION.KEY=VALUE ...]   (keys: docs/config.md)\n",
                   argv[0]);
      return 0;
    }
  }
  auto config = ConfigFromCommandLine(argc, argv, section);
  if (!config.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], config.status().ToString().c_str());
    return 2;
  }
  // Block the stop signals in every thread; one thread waits for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto process = start(*config);
  if (!process.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], process.status().ToString().c_str());
    return 1;
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    ICE_LOG(INFO) << "signal " << sig << ": shutting down";
    process->shutdown();
  });
  process->wait();
  // wait() returned: either the signal thread shut us down, or the server stopped by itself.
  process->shutdown();
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return 0;
}

}  // namespace icecache::cluster
