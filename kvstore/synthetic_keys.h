// Synthetic attention keys and queries with the structure real long-context heads show, for tests
// and benchmarks of the retrieval path (no model needed):
//  * topic clusters: each token belongs to one of num_topics topics, and topics come in runs of
//    related consecutive tokens (mean run length run_mean);
//  * RoPE: keys are rotated by their position, queries by the decode position (rope_base); the
//    topic signal lives mostly in the low-frequency (slowly rotating) channel pairs, as in LLMs;
//  * outlier channels: a few channels carry a large constant offset in every key;
//  * an attention-sink token at position 0 that every query likes;
//  * queries out of the keys' distribution: larger norm, their own bias direction, and noise.
// Deterministic for a given seed. Not thread-safe state: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace icecache::kvstore {

struct SyntheticOptions {
  int num_topics = 64;
  double run_mean = 24.0;      // mean length of a run of same-topic tokens
  double key_noise = 0.6;      // per-channel noise relative to the topic signal
  double query_noise = 0.6;
  double query_scale = 3.0;    // query norm relative to keys
  double rope_base = 500000.0; // 0 disables RoPE
  int outlier_channels = 4;
  double outlier_scale = 4.0;
  bool sink_token = true;
  // Out-of-distribution drift: each query is mixed with a random direction of the same norm,
  // q = (1 - drift) q_topic + drift |q_topic| r/|r| (0: off, and no random draw is made).
  double query_drift = 0.0;
  uint64_t seed = 7;
};

// Named harder families (for benchmarks; every one keeps RoPE and the sink token):
//   default    SyntheticOptions{} (64 topics in runs of ~24 tokens)
//   scattered  256 topics in runs of ~3 tokens: a page of consecutive tokens mixes topics
//   outliers   8 outlier channels of scale 10 and noisier keys (0.8)
//   drift      queries 50 % off their topic (query_drift 0.5) and noisier (1.0)
//   broad      16 topics in long runs (~96 tokens) with noisy keys (1.2): diffuse attention
//   hard       scattered + outliers + drift
// INVALID_ARGUMENT naming the known families otherwise.
StatusOr<SyntheticOptions> SyntheticFamily(const std::string& name);
inline constexpr const char kSyntheticFamilies[] = "default,scattered,outliers,drift,broad,hard";

struct SyntheticData {
  int n = 0, dim = 0, num_queries = 0;
  std::vector<float> keys;     // [n, dim]
  std::vector<float> values;   // [n, dim]
  std::vector<float> queries;  // [num_queries, dim], rotated for position n
  std::vector<int32_t> topic;  // [n]: each key's topic (the sink token keeps the topic its draw gave)
};

SyntheticData MakeSyntheticData(int n, int dim, int num_queries, const SyntheticOptions& options = {});

}  // namespace icecache::kvstore
