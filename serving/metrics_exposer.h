// Serving a prometheus-cpp registry on /metrics (the three services share this); the families
// themselves are listed in serving/metric_families.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace icecache::cluster {

// Serves `registry` at http://<bind_host>:<port>/metrics. UNAVAILABLE when the port cannot be
// bound (the message names it).
StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(const std::string& bind_host, int port,
                                                                  std::shared_ptr<prometheus::Registry> registry);

}  // namespace icecache::cluster
