// The router process as a library: serves icecache.v1.Generation (+ health, reflection) and
// /metrics; validates requests, tokenizes text (when the model directory has a tokenizer), picks
// a decode worker (free KV pages, active sequences) and a prefill worker (queued prompt tokens),
// runs Reserve -> Prefill -> Decode and relays the token stream. Client cancellation and
// deadlines propagate to the workers (their calls are children of the client's call).
// Health: the router reports SERVING (overall and for icecache.v1.Generation) only while at least
// one prefill and one decode worker answer their Stats calls.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "proto/cluster_config.h"

namespace icecache::router {

class RouterServer {
 public:
  // Uses config.model (config.json, optional tokenizer.json; weights are not loaded),
  // config.cache, config.limits, config.router.
  static StatusOr<std::unique_ptr<RouterServer>> Start(const cluster::ClusterConfig& config);
  ~RouterServer();

  int port() const;
  std::string address() const;
  int metrics_port() const;  // 0 when disabled
  void Wait();
  void Shutdown();

 private:
  struct Impl;
  explicit RouterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace icecache::router
