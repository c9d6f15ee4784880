// icecache-prefill: a prefill worker process. Options: see cluster::ConfigFromCommandLine.
#include "prefill_worker/prefill_server.h"
#include "serving/worker_main.h"

int main(int argc, char** argv) {
  return icecache::cluster::WorkerMain(argc, argv, "prefill", [](const icecache::cluster::ClusterConfig& c)
                                           -> icecache::StatusOr<icecache::cluster::ServingProcess> {
    ICE_ASSIGN_OR_RETURN(auto server, icecache::prefill::PrefillServer::Start(c));
    std::shared_ptr<icecache::prefill::PrefillServer> shared(std::move(server));
    const double drain = c.prefill.drain_seconds;
    return icecache::cluster::ServingProcess{[shared] { shared->Wait(); }, [shared, drain] {
                                               shared->Drain(drain);
                                               shared->Shutdown();
                                             }};
  });
}
