// SpawnProcess / WaitExit on real child processes (/bin/sh): the log file, the environment, exit
// codes and signals, a signal mask the parent set, and the errors.
#include "common/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace icecache {
namespace {

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string LogPath(const std::string& name) {
  return ::testing::TempDir() + "/icecache_subprocess_" + std::to_string(getpid()) + "_" + name + ".log";
}

TEST(Subprocess, LogEnvironmentAndExitCode) {
  const std::string log = LogPath("env");
  setenv("ICECACHE_SUBPROCESS_KEPT", "parent", 1);
  setenv("ICECACHE_SUBPROCESS_SET", "parent", 1);
  SpawnOptions o;
  o.log_path = log;
  o.env = {{"ICECACHE_SUBPROCESS_SET", "first"}, {"ICECACHE_SUBPROCESS_SET", "child"}, {"ICECACHE_SUBPROCESS_NEW", "x"}};
  auto pid = SpawnProcess(
      {"/bin/sh", "-c",
       "echo \"$ICECACHE_SUBPROCESS_KEPT $ICECACHE_SUBPROCESS_SET $ICECACHE_SUBPROCESS_NEW\"; echo err >&2; exit 3"},
      o);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  EXPECT_EQ(WaitExit(*pid), 3);
  EXPECT_EQ(Read(log), "parent child x\nerr\n");

  // The file is truncated by default and appended to with append_log.
  o.env.clear();
  pid = SpawnProcess({"/bin/sh", "-c", "echo one"}, o);
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(WaitExit(*pid), 0);
  o.append_log = true;
  pid = SpawnProcess({"/bin/sh", "-c", "echo two"}, o);
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(WaitExit(*pid), 0);
  EXPECT_EQ(Read(log), "one\ntwo\n");
  std::filesystem::remove(log);
}

TEST(Subprocess, ChildGetsDefaultSignalsWhateverTheParentBlocked) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  struct sigaction ignore {}, previous{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGINT, &ignore, &previous), 0);
  auto pid = SpawnProcess({"/bin/sh", "-c", "kill -TERM $$; sleep 30"});
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(WaitExit(*pid), 128 + SIGTERM);
  pid = SpawnProcess({"/bin/sh", "-c", "kill -INT $$; sleep 30"});
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(WaitExit(*pid), 128 + SIGINT);
  sigaction(SIGINT, &previous, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

TEST(Subprocess, ErrorsAreClear) {
  EXPECT_EQ(SpawnProcess({}).status().code(), StatusCode::kInvalidArgument);
  SpawnOptions o;
  o.log_path = "/nonexistent-dir/x.log";
  auto bad_log = SpawnProcess({"/bin/true"}, o);
  EXPECT_EQ(bad_log.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(bad_log.status().message().find("/nonexistent-dir/x.log"), std::string::npos);

  o.log_path = LogPath("missing");
  auto pid = SpawnProcess({"/nonexistent-binary", "--flag"}, o);
  ASSERT_TRUE(pid.ok());  // fork succeeded; exec fails in the child
  EXPECT_EQ(WaitExit(*pid), 127);
  EXPECT_EQ(Read(o.log_path), "cannot run /nonexistent-binary\n");
  std::filesystem::remove(o.log_path);

  EXPECT_EQ(WaitExit(getpid()), -1);  // not a child
}

}  // namespace
}  // namespace icecache
