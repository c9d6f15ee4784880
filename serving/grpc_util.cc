#include "serving/grpc_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cstdint>

namespace icecache::cluster {

StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& listen,
                                                    const std::vector<grpc::Service*>& services,
                                                    const std::vector<std::string>& service_names,
                                                    int* bound_port, int64_t max_message_bytes,
                                                    std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT on a server's socket by default, so a second server on a port already
  // served binds without an error and the kernel splits connections between the two processes (a
  // worker started twice on one port would take half of another's requests). One port, one server.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(listen, credentials ? credentials : grpc::InsecureServerCredentials(), &port);
  for (grpc::Service* s : services) builder.RegisterService(s);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message_bytes, INT32_MAX)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return UnavailableError("cannot listen on " + listen + " (address in use or invalid)");
  if (auto* health = server->GetHealthCheckService()) {
    health->SetServingStatus(true);
    for (const auto& name : service_names) health->SetServingStatus(name, true);
  }
  if (bound_port) *bound_port = port;
  return server;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int64_t max_message_bytes,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           const std::string& server_name) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // A peer that went away (a worker restarting) is reconnected to within 1 s of its return:
  // gRPC's default backoff grows to 120 s, and calls fail at once while it waits.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message_bytes, INT32_MAX)));
  if (credentials && !server_name.empty()) args.SetSslTargetNameOverride(server_name);
  return grpc::CreateCustomChannel(target, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
}

Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) {
    return InvalidArgumentError("'" + address + "' is not HOST:PORT");
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  try {
    size_t used = 0;
    *port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || *port < 0 || *port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return InvalidArgumentError("'" + address + "' has a bad port");
  }
  return Status::Ok();
}

}  // namespace icecache::cluster
