// icecache-router: the cluster's public Generation endpoint. Options: cluster::ConfigFromCommandLine.
#include "serving/worker_main.h"
#include "router/router_server.h"

int main(int argc, char** argv) {
  return icecache::cluster::WorkerMain(argc, argv, "router", [](const icecache::cluster::ClusterConfig& c)
                                           -> icecache::StatusOr<icecache::cluster::ServingProcess> {
    ICE_ASSIGN_OR_RETURN(auto server, icecache::router::RouterServer::Start(c));
    std::shared_ptr<icecache::router::RouterServer> shared(std::move(server));
    const double drain = c.router.drain_seconds;
    return icecache::cluster::ServingProcess{[shared] { shared->Wait(); }, [shared, drain] {
                                               shared->Drain(drain);
                                               shared->Shutdown();
                                             }};
  });
}
