// The decode worker process as a library: loads the model, creates the UCX transport and the
// decode engine, and serves icecache.v1.DecodeWorker (+ health, reflection) and /metrics.
// Tests start it in-process; decode_main.cc is the icecache-decode binary (SIGTERM: Drain for
// decode.drain_seconds, then Shutdown).
//
// Health (grpc.health.v1, "" and icecache.v1.DecodeWorker): SERVING while the engine loop comes
// round (heartbeat within decode.health_stall_seconds) and the worker is not draining; Stats
// answers UNAVAILABLE while the loop is stalled, so routers rank the worker last.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "decode_worker/decode_engine.h"
#include "serving/cluster_config.h"

namespace icecache::decode {

class DecodeServer {
 public:
  // Uses config.model, config.cache, config.decode, config.ucx. decode.listen may use port 0.
  static StatusOr<std::unique_ptr<DecodeServer>> Start(const cluster::ClusterConfig& config);
  ~DecodeServer();  // Shutdown()

  int port() const;
  std::string address() const;  // "host:port" actually bound
  int metrics_port() const;     // 0 when disabled
  DecodeEngineStats stats() const;

  void Wait();      // until Shutdown()
  // Graceful stop, step one (SIGTERM): reports NOT_SERVING, refuses new reservations
  // (UNAVAILABLE: the router moves on) and waits up to `seconds` for live sequences to finish.
  // Returns true when none is left; otherwise the sequences still live are ended with
  // UNAVAILABLE (so the router migrates them) and false is returned. Shutdown() must still follow.
  bool Drain(double seconds);
  void Shutdown();  // stops serving; cancels running sequences

 private:
  struct Impl;
  explicit DecodeServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace icecache::decode
