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

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                        0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10,   20,   40,  80, 120};
  return b;
}

}  // namespace icecache::cluster
