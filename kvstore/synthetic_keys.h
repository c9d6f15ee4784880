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
#include <vector>

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
  uint64_t seed = 7;
};

struct SyntheticData {
  int n = 0, dim = 0, num_queries = 0;
  std::vector<float> keys;     // [n, dim]
  std::vector<float> values;   // [n, dim]
  std::vector<float> queries;  // [num_queries, dim], rotated for position n
};

SyntheticData MakeSyntheticData(int n, int dim, int num_queries, const SyntheticOptions& options = {});

}  // namespace icecache::kvstore
