// WorkerMain's stop signals on a forked process: a process-directed SIGTERM (what kill(1) and
// Kubernetes send) runs the server's shutdown and the process exits 0, also when a thread that
// existed before WorkerMain never blocked the signal, as a thread a shared library's constructor
// starts does (OpenBLAS's pool where libopenblas is linked: every sanitizer build, whose link has
// no --as-needed). With SIG_DFL + sigwait such a thread took the signal and the process died of
// it (exit 143, cluster_migration_test's SIGTERM cases under TSan). Without a signal, a server
// that stops by itself still ends WorkerMain with 0.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "serving/worker_main.h"

namespace icecache::cluster {
namespace {

constexpr int kShutdownRan = 0;
constexpr int kNoShutdown = 3;

// In the child: WorkerMain with a server that runs until its shutdown (or, with
// `stop_by_itself`, stops at once); `ready` gets a byte once the server has started. Exits 0
// when WorkerMain returned 0 after calling the server's shutdown.
[[noreturn]] void RunChild(int ready, bool stop_by_itself) {
  // Started before WorkerMain with an empty signal mask, like a library constructor's thread.
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  std::thread foreign([] {
    for (;;) pause();
  });
  foreign.detach();

  struct Server {
    std::mutex mu;
    std::condition_variable cv;
    bool stopped = false;
    int shutdowns = 0;
  };
  auto server = std::make_shared<Server>();
  char name[] = "icecache-test-worker";
  char* argv[] = {name, nullptr};
  const int rc = WorkerMain(1, argv, "decode", [&](const ClusterConfig&) -> StatusOr<ServingProcess> {
    if (stop_by_itself) server->stopped = true;
    const char byte = 1;
    if (write(ready, &byte, 1) != 1) _exit(20);
    return ServingProcess{[server] {
                            std::unique_lock<std::mutex> l(server->mu);
                            server->cv.wait(l, [&] { return server->stopped; });
                          },
                          [server] {
                            std::lock_guard<std::mutex> l(server->mu);
                            ++server->shutdowns;
                            server->stopped = true;
                            server->cv.notify_all();
                          }};
  });
  if (rc != 0) _exit(10 + rc);
  _exit(server->shutdowns >= 1 ? kShutdownRan : kNoShutdown);
}

// Forks the child, waits for its server to start, sends `sig` to the process unless 0, and
// returns its exit code (128 + signal when a signal ended it; -1 when it hung for 120 s, then
// killed: a hang guard, not a timing check).
int RunWorker(int sig, bool stop_by_itself) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    RunChild(fds[1], stop_by_itself);
  }
  close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 120'000), 1) << "the child's server never started";
  char byte = 0;
  EXPECT_EQ(read(fds[0], &byte, 1), 1);
  close(fds[0]);
  if (sig != 0) kill(pid, sig);
  int status = 0;
  for (int i = 0; i < 1200; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

TEST(WorkerMain, SigtermShutsDownAndExitsZeroEvenWithAThreadThatDoesNotBlockIt) {
  // Several rounds: the kernel picks among the threads that do not block the signal.
  for (int round = 0; round < 5; ++round) {
    EXPECT_EQ(RunWorker(SIGTERM, false), kShutdownRan) << "round " << round << " (143: killed by SIGTERM)";
  }
}

TEST(WorkerMain, SigintShutsDownAndExitsZero) { EXPECT_EQ(RunWorker(SIGINT, false), kShutdownRan); }

TEST(WorkerMain, ServerThatStopsByItselfEndsWithZero) { EXPECT_EQ(RunWorker(0, true), kShutdownRan); }

}  // namespace
}  // namespace icecache::cluster
