// Glue between icecache::Status and gRPC, and the common server setup of the three services
// (health checking and reflection on every server). Light header: no generated code.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace icecache::cluster {

inline grpc::Status ToGrpc(const Status& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}
inline Status FromGrpc(const grpc::Status& s) {
  return s.ok() ? Status::Ok() : Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

// limits.max_message_bytes' default: the largest message a server accepts or a channel receives.
inline constexpr int64_t kDefaultMaxMessageBytes = 16 << 20;

// Builds and starts a server on `listen` ("host:port"; port 0 picks a free one) serving
// `services`, grpc.health.v1.Health (status SERVING for "" and each service name) and server
// reflection. Requests larger than max_message_bytes are refused by gRPC (RESOURCE_EXHAUSTED)
// before any handler runs. *bound_port receives the port. UNAVAILABLE when the address cannot be
// bound, also when another server (of any process) listens there: SO_REUSEPORT is off.
// `credentials`: how clients must connect (serving/internal_tls.h for the workers' mTLS);
// null = plaintext.
StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& listen,
                                                    const std::vector<grpc::Service*>& services,
                                                    const std::vector<std::string>& service_names,
                                                    int* bound_port,
                                                    int64_t max_message_bytes = kDefaultMaxMessageBytes,
                                                    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

// A channel to "host:port" with keepalive settings suited to long streams and a reconnect backoff
// of at most 1 s (a restarted peer is reached again within a second), receiving messages up
// to max_message_bytes. `credentials` null = plaintext; with TLS credentials, `server_name` (when
// not empty) is the name the server's certificate must carry instead of the target's host.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           int64_t max_message_bytes = kDefaultMaxMessageBytes,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                                           const std::string& server_name = "");

// "host:port" -> host and port. INVALID_ARGUMENT naming the value.
Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace icecache::cluster
