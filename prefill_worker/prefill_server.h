// The prefill worker process as a library: loads the model, creates the UCX transport and the
// prefill engine, serves icecache.v1.PrefillWorker (+ health, reflection) and /metrics.
// Health ("" and icecache.v1.PrefillWorker): SERVING while the engine shows life (heartbeat
// within prefill.health_stall_seconds; Stats answers UNAVAILABLE otherwise), NOT_SERVING from
// Drain or Shutdown on. prefill_main.cc is the icecache-prefill binary (SIGTERM: Drain for
// prefill.drain_seconds, then Shutdown).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "prefill_worker/prefill_engine.h"
#include "serving/cluster_config.h"

namespace icecache::prefill {

class PrefillServer {
 public:
  // Uses config.model, config.cache, config.prefill, config.ucx. prefill.listen may use port 0.
  static StatusOr<std::unique_ptr<PrefillServer>> Start(const cluster::ClusterConfig& config);
  ~PrefillServer();

  int port() const;
  std::string address() const;
  // The engine's cumulative counters (build time hidden or not, bytes and segments shipped).
  // REQUIRES: not shut down.
  PrefillEngineStats engine_stats() const;
  void Wait();
  // Graceful stop, step one (SIGTERM): reports NOT_SERVING, refuses queued and new prompts with
  // UNAVAILABLE (the router tries another prefill worker) and waits up to `seconds` for the
  // prompts already in a forward pass or shipping to finish. Returns true when none is left.
  // Shutdown() must still follow.
  bool Drain(double seconds);
  void Shutdown();

 private:
  struct Impl;
  explicit PrefillServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace icecache::prefill
