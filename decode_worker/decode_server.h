// The decode worker process as a library: loads the model, creates the UCX transport and the
// decode engine, and serves icecache.v1.DecodeWorker (+ health, reflection) and /metrics.
// Tests start it in-process; decode_main.cc is the icecache-decode binary.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "decode_worker/decode_engine.h"
#include "proto/cluster_config.h"

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
  void Shutdown();  // stops serving; cancels running sequences

 private:
  struct Impl;
  explicit DecodeServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace icecache::decode
