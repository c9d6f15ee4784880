#include "serving/worker_main.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/logging.h"

namespace icecache::cluster {
namespace {

// The stop-signal pipe: the handler writes the signal's number, the signal thread reads it.
int g_stop_pipe[2] = {-1, -1};

// Async-signal-safe: one write(2) to a non-blocking pipe, errno preserved.
extern "C" void OnStopSignal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_stop_pipe[1], &byte, 1);
  errno = saved;
}

// Installs OnStopSignal for SIGINT and SIGTERM. A handler rather than SIG_DFL + sigwait: with
// SIG_DFL, a process-directed signal that the kernel hands to any thread not blocking it ends
// the whole process, and threads that a shared library's constructor starts before main (e.g.
// OpenBLAS's pool, whenever libopenblas is linked without --as-needed, as in every sanitizer
// build) never blocked it. With a handler, whichever thread takes the signal only writes a byte.
Status InstallStopHandler() {
  if (pipe2(g_stop_pipe, O_CLOEXEC) != 0) return InternalError(std::string("pipe2: ") + std::strerror(errno));
  if (fcntl(g_stop_pipe[1], F_SETFL, O_NONBLOCK) != 0) {
    return InternalError(std::string("fcntl: ") + std::strerror(errno));
  }
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) {
    if (sigaction(sig, &sa, nullptr) != 0) return InternalError(std::string("sigaction: ") + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

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
  if (Status s = InstallStopHandler(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], s.ToString().c_str());
    return 1;
  }
  // The threads the server starts inherit the stop signals blocked (no EINTR in them); only the
  // signal thread unblocks them, so the handler runs there unless a foreign thread takes it.
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
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    // Wait in poll(2) with a timeout, then read: a signal that arrives while this thread sits
    // in read(2) (restarted by SA_RESTART) is never handled under ThreadSanitizer, which defers
    // a handler until the thread leaves a call it does not count as blocking (GCC 12's TSan
    // counts poll, not read: the SIGTERM cases of cluster_migration_test hung there). Each
    // timeout is such an exit; in other builds the handler wakes poll at once.
    pollfd pfd{g_stop_pipe[0], POLLIN, 0};
    while (poll(&pfd, 1, 200) <= 0) {
    }
    unsigned char sig = 0;
    ssize_t n;
    do {
      n = read(g_stop_pipe[0], &sig, 1);
    } while (n < 0 && errno == EINTR);
    if (n == 1 && sig != 0) {  // 0: the wake-up below, the server stopped by itself
      ICE_LOG(INFO) << "signal " << static_cast<int>(sig) << ": shutting down";
      process->shutdown();
    }
  });
  process->wait();
  // wait() returned: either the signal thread shut us down, or the server stopped by itself.
  process->shutdown();
  OnStopSignal(0);  // wakes the signal thread if no signal came
  waiter.join();
  return 0;
}

}  // namespace icecache::cluster
