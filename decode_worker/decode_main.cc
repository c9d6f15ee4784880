// icecache-decode: a decode worker process. Options: see cluster::ConfigFromCommandLine.
#include "decode_worker/decode_server.h"
#include "serving/worker_main.h"

int main(int argc, char** argv) {
  return icecache::cluster::WorkerMain(argc, argv, "decode", [](const icecache::cluster::ClusterConfig& c)
                                           -> icecache::StatusOr<icecache::cluster::ServingProcess> {
    ICE_ASSIGN_OR_RETURN(auto server, icecache::decode::DecodeServer::Start(c));
    std::shared_ptr<icecache::decode::DecodeServer> shared(std::move(server));
    const double drain = c.decode.drain_seconds;
    return icecache::cluster::ServingProcess{[shared] { shared->Wait(); }, [shared, drain] {
                                               shared->Drain(drain);
                                               shared->Shutdown();
                                             }};
  });
}
