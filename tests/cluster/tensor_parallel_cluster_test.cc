// Tensor-parallel workers in a real cluster: `icecache cluster --prefill-tp P --decode-tp D` as
// separate processes on loopback (router, one prefill and one decode worker; each worker's ranks
// are CPU threads), driven by `icecache generate --router`. The prefill worker's ranks capture
// the K/V of their own kv heads and ship the whole sequence in one transfer; the decode worker
// splits it by head among its ranks (docs/parallel.md). Checked, for P/D = 1/2, 2/1 and 2/4:
//  * greedy decoding of 40 tokens with budget `full` prints exactly the ids of one process
//    (`icecache generate --model`, dense KV, no tensor parallelism);
//  * a sparse budget (3 pages of 8 tokens: sink + window + 1 retrieved leaf of a sparse layer)
//    completes with 40 tokens;
//  * the decode worker exports icecache_collective_seconds and icecache_rank_step_seconds for each
//    of its ranks.
// Also 1/4 and 1/2 with more decode ranks than kv heads (each rank a copy of its kv head). The
// fixtures are real checkpoints (tests/fixtures/models); KV is kept in fp32 so that `full` is
// exact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster/free_ports.h"
#include "tests/cluster/process_util.h"

namespace icecache::testing {
namespace {

const std::string kBin = std::string(ICECACHE_BINARY_DIR) + "/bin/";

std::string Fixture(const std::string& name) { return std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/models/" + name; }

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

// The ids `icecache generate --output ids` printed (separated by commas, spaces or newlines).
std::vector<int> Ids(const std::string& text) {
  std::vector<int> ids;
  std::string cur;
  for (char ch : text + "\n") {
    if (ch >= '0' && ch <= '9') {
      cur += ch;
    } else if (!cur.empty()) {
      ids.push_back(std::stoi(cur));
      cur.clear();
    }
  }
  return ids;
}

std::string PromptIds() {
  std::string s;
  for (int i = 0; i < 70; ++i) s += (i ? "," : "") + std::to_string((i * 37 + 11) % 300);
  return s;
}

// A running `icecache cluster`, stopped (SIGTERM, exit 0 expected) by the destructor.
class Cluster {
 public:
  Cluster(const std::string& model, int prefill_tp, int decode_tp) {
    port_ = FreePortRange(6, 104729u + 31u * prefill_tp + decode_tp);
    if (port_ <= 0) return;
    pid_ = Spawn({kBin + "icecache", "cluster", "--model", model, "--port", std::to_string(port_), "--metrics-port",
                  std::to_string(port_ + 3), "--prefill-tp", std::to_string(prefill_tp), "--decode-tp",
                  std::to_string(decode_tp), "--device", "cpu", "--set", "ucx.net_devices=lo", "--set",
                  "cache.page_size=8", "--set", "cache.kv_dtype=f32", "--set", "cache.dense_layers=1", "--set",
                  "cache.sink_pages=1", "--set", "cache.window_pages=1"});
    for (int i = 0; i < 400 && !healthy_; ++i) {  // up to ~40 s on a loaded machine
      healthy_ = WaitExit(Spawn({kBin + "icecache", "health", "--router", router(), "--timeout", "1"})) == 0;
      if (!healthy_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~Cluster() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      EXPECT_EQ(WaitExit(pid_), 0);
    }
  }
  bool healthy() const { return healthy_; }
  std::string router() const { return "127.0.0.1:" + std::to_string(port_); }
  // Metrics ports: router port+3, prefill worker port+4, decode worker port+5.
  std::string DecodeMetrics() const {
    return Capture("curl -s --max-time 5 http://127.0.0.1:" + std::to_string(port_ + 5) + "/metrics");
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  bool healthy_ = false;
};

void ExpectClusterMatchesOneProcess(const std::string& model, int prefill_tp, int decode_tp) {
  const std::string args = " --prompt-ids " + PromptIds() + " --max-tokens 40 --ignore-eos --output ids";
  const std::string local = Capture(kBin + "icecache generate --model " + model + " --kv-page-size 8" + args);
  ASSERT_EQ(Ids(local).size(), 40u) << local;

  Cluster c(model, prefill_tp, decode_tp);
  ASSERT_TRUE(c.healthy()) << "prefill tp " << prefill_tp << ", decode tp " << decode_tp;
  const std::string full = Capture(kBin + "icecache generate --router " + c.router() + " --budget full" + args);
  EXPECT_EQ(Ids(full), Ids(local)) << "prefill tp " << prefill_tp << ", decode tp " << decode_tp << "\ncluster: " << full
                                   << "\none process: " << local;
  const std::string sparse = Capture(kBin + "icecache generate --router " + c.router() + " --budget 3" + args);
  EXPECT_EQ(Ids(sparse).size(), 40u) << sparse;

  if (decode_tp > 1) {
    const std::string metrics = c.DecodeMetrics();
    for (int r = 0; r < decode_tp; ++r) {
      const std::string rank = "rank=\"" + std::to_string(r) + "\"";
      // Both families: the collectives and the rank's whole step; a step is never shorter than its
      // collectives.
      double sums[2] = {-1, -1};
      for (int f = 0; f < 2; ++f) {
        const std::string family = f == 0 ? "icecache_collective_seconds" : "icecache_rank_step_seconds";
        bool found = false;
        std::istringstream lines(metrics);
        for (std::string line; std::getline(lines, line);) {
          if (line.find(rank) == std::string::npos) continue;
          if (line.rfind(family + "_sum{", 0) == 0) sums[f] = std::stod(line.substr(line.rfind(' ') + 1));
          if (line.rfind(family + "_count{", 0) != 0) continue;
          found = true;
          EXPECT_GE(std::stod(line.substr(line.rfind(' ') + 1)), 78.0) << line;  // one per decode step: 2 requests x 39
        }
        EXPECT_TRUE(found) << "no " << family << " for " << rank << " in\n" << metrics;
      }
      EXPECT_GT(sums[1], 0.0) << rank;
      EXPECT_GE(sums[1], sums[0]) << rank << ": a rank's steps took less time than its collectives";
    }
  }
}

// llama_gqa_f32: 4 q heads over 2 kv heads, fp32 weights: one kv head per decode rank.
TEST(TensorParallelCluster, OneRankPrefillTwoRankDecodeGivesOneProcessTokens) {
  ExpectClusterMatchesOneProcess(Fixture("llama_gqa_f32"), 1, 2);
}

// The prefill worker's two ranks each capture one kv head; the one decode rank gets both.
TEST(TensorParallelCluster, TwoRankPrefillOneRankDecodeGivesOneProcessTokens) {
  ExpectClusterMatchesOneProcess(Fixture("llama_gqa_f32"), 2, 1);
}

// qwen3_qknorm_tied_bf16: 8 q heads over 4 kv heads, q/k norms, tied embeddings: two kv heads per
// prefill rank, one per decode rank (different sizes on both sides, neither 1).
TEST(TensorParallelCluster, TwoRankPrefillFourRankDecodeGivesOneProcessTokens) {
  ExpectClusterMatchesOneProcess(Fixture("qwen3_qknorm_tied_bf16"), 2, 4);
}

// More decode ranks than kv heads: each rank decodes over its own copy of its kv head's pages
// and tree (llama_gqa_f32: 4 q heads over 2 kv heads on 4 ranks, one q head each; the llama3
// fixture: 4 q heads over 1 kv head on 2 ranks, bf16 weights, sharded safetensors).
TEST(TensorParallelCluster, OneRankPrefillFourRankDecodeReplicatesKvHeads) {
  ExpectClusterMatchesOneProcess(Fixture("llama_gqa_f32"), 1, 4);
}

TEST(TensorParallelCluster, TwoRankDecodeReplicatesTheOneKvHead) {
  ExpectClusterMatchesOneProcess(Fixture("llama3_scaling_tied_bf16_sharded"), 1, 2);
}

// A decode worker whose ranks do not divide the heads (4 q and 2 kv heads on 3 ranks) refuses to
// start, and the cluster says so (exit 1) instead of serving.
TEST(TensorParallelCluster, DecodeWorkerRefusesRanksThatDoNotDivideTheHeads) {
  const int port = FreePortRange(3, 7727u);
  ASSERT_GT(port, 0);
  const pid_t cluster = Spawn({kBin + "icecache", "cluster", "--model", Fixture("llama_gqa_f32"), "--port",
                               std::to_string(port), "--decode-tp", "3", "--device", "cpu", "--once", "--set",
                               "ucx.net_devices=lo"});
  EXPECT_EQ(WaitExit(cluster), 1);
}

}  // namespace
}  // namespace icecache::testing
