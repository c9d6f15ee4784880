// `icecache cluster` as separate processes (fork/exec of the real binaries), driven through
// `icecache health` and the client library.
#include <gtest/gtest.h>

#include "tests/cluster/free_ports.h"
#include "tests/cluster/process_util.h"
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "kernels/backend.h"
#include "model/random_checkpoint.h"
#include "client/client.h"

namespace icecache::testing {
namespace {

const std::string kBin = std::string(ICECACHE_BINARY_DIR) + "/bin/";

int FreePortRange(int n) { return testing::FreePortRange(n, 7919u); }

// stdout of a shell command (stderr dropped).
std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

TEST(ClusterProcess, StartsServesAndStopsOnSigterm) {
  std::string dir = ::testing::TempDir() + "/icecache_cluster_process_model";
  model::RandomModelSpec spec;
  spec.layers = 3;
  spec.vocab = 300;
  spec.dtype = kernels::DType::kF32;
  ASSERT_TRUE(model::WriteRandomCheckpoint(dir, spec).ok());
  int port = FreePortRange(4);
  ASSERT_GT(port, 0);
  std::string router = "127.0.0.1:" + std::to_string(port);

  // Not serving before the cluster starts.
  EXPECT_EQ(WaitExit(Spawn({kBin + "icecache", "health", "--router", router, "--timeout", "0.5"})), 1);

  pid_t cluster = Spawn({kBin + "icecache", "cluster", "--model", dir, "--port", std::to_string(port), "--prefill", "1",
                       "--decode", "2", "--set", "ucx.net_devices=lo", "--set", "cache.page_size=8",
                       "--set", "cache.kv_dtype=f32"});  // the local run below keeps fp32 KV
  bool healthy = false;
  for (int i = 0; i < 600 && !healthy; ++i) {  // up to 60 s on a loaded machine
    healthy = WaitExit(Spawn({kBin + "icecache", "health", "--router", router, "--timeout", "1"})) == 0;
    if (!healthy) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(healthy);

  router::RemoteGenerateOptions o;
  o.router = router;
  o.prompt = "the cluster runs in separate processes";
  o.max_tokens = 6;
  o.ignore_eos = true;
  o.budget_pages = 5;
  int tokens = 0;
  bool last = false;
  Status s = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
    tokens += static_cast<int>(c.token_ids.size());
    last = last || c.last;
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tokens, 6);
  EXPECT_TRUE(last);

  // `icecache generate --router` with budget full prints exactly the ids a local run prints.
  std::string ids = "--prompt-ids 5,17,29,41,53,65,77,89,101,113,125,137,149,161,173 --max-tokens 8 --ignore-eos "
                    "--output ids";
  std::string remote = Capture(kBin + "icecache generate --router " + router + " --budget full " + ids);
  std::string local = Capture(kBin + "icecache generate --model " + dir + " --kv-page-size 8 " + ids);
  EXPECT_FALSE(remote.empty());
  EXPECT_EQ(remote, local);

  kill(cluster, SIGTERM);
  EXPECT_EQ(WaitExit(cluster), 0);
  // Every child is gone: nothing answers on the router's port any more.
  EXPECT_EQ(WaitExit(Spawn({kBin + "icecache", "health", "--router", router, "--timeout", "0.5"})), 1);
}

TEST(ClusterProcess, ReportsAChildThatCannotStart) {
  // No model there: the workers exit with an error, which the supervisor reports (exit 1).
  int port = FreePortRange(3);
  ASSERT_GT(port, 0);
  pid_t cluster = Spawn({kBin + "icecache", "cluster", "--model", ::testing::TempDir() + "/no_such_model", "--port",
                       std::to_string(port)});
  EXPECT_EQ(WaitExit(cluster), 1);
}

TEST(ClusterProcess, OnceExitsWhenServing) {
  std::string dir = ::testing::TempDir() + "/icecache_cluster_process_model_once";
  model::RandomModelSpec spec;
  spec.layers = 2;
  spec.vocab = 300;
  ASSERT_TRUE(model::WriteRandomCheckpoint(dir, spec).ok());
  int port = FreePortRange(3);
  ASSERT_GT(port, 0);
  EXPECT_EQ(WaitExit(Spawn({kBin + "icecache", "cluster", "--model", dir, "--port", std::to_string(port), "--once",
                          "--set", "ucx.net_devices=lo"})),
            0);
}

// Placement: every worker is stated with its device; without a GPU (or with --device cpu) all
// run on the CPU, and a CUDA device that is not there is refused before anything starts.
TEST(ClusterProcess, PlacesWorkersOnDevices) {
  std::string dir = ::testing::TempDir() + "/icecache_cluster_process_model_place";
  model::RandomModelSpec spec;
  spec.layers = 2;
  spec.vocab = 300;
  ASSERT_TRUE(model::WriteRandomCheckpoint(dir, spec).ok());
  int port = FreePortRange(4);
  ASSERT_GT(port, 0);
  const std::string out = Capture(kBin + "icecache cluster --model " + dir + " --port " + std::to_string(port) +
                                  " --decode 2 --device cpu --once --set ucx.net_devices=lo");
  const std::string p = std::to_string(port);
  EXPECT_NE(out.find("prefill worker 127.0.0.1:" + std::to_string(port + 1) + " on cpu"), std::string::npos) << out;
  EXPECT_NE(out.find("decode worker 127.0.0.1:" + std::to_string(port + 3) + " on cpu"), std::string::npos) << out;
  if (!kernels::CudaAvailable()) {
    EXPECT_EQ(WaitExit(Spawn({kBin + "icecache", "cluster", "--model", dir, "--port", p, "--device", "cuda", "--once"})),
              1);
  }
  EXPECT_EQ(WaitExit(Spawn({kBin + "icecache", "cluster", "--model", dir, "--port", p, "--device", "tpu", "--once"})),
            2);
}

}  // namespace
}  // namespace icecache::testing
