#include "serving/metrics_exposer.h"

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <exception>
#include <vector>

namespace icecache::cluster {

StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(const std::string& bind_host, int port,
                                                                  std::shared_ptr<prometheus::Registry> registry) {
  std::string address = bind_host + ":" + std::to_string(port);
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address);
    exposer->RegisterCollectable(registry);
    return exposer;
  } catch (const std::exception& e) {
    return UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
}

}  // namespace icecache::cluster
