// TLS of the cluster's gRPC servers: mutual TLS for the internal plane (router -> prefill/decode
// workers) from a cluster config's internal_tls section, a throwaway CA for loopback clusters, and
// server-only TLS for the router's public port (router.tls_cert_file / tls_key_file).
//
// With internal_tls set, a worker's server requires a client certificate signed by ca_file (any
// other client fails the TLS handshake: the RPC ends UNAVAILABLE before a handler runs) and the
// router's channels present cert_file and verify the worker's certificate against ca_file and
// the address's host (or server_name). Without it both sides are plaintext.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "serving/cluster_config.h"

namespace icecache::cluster {

// Server credentials of a worker: mTLS (client certificate required and verified) when
// tls.enabled(), else insecure. INVALID_ARGUMENT naming a file that cannot be read or is not PEM.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> InternalServerCredentials(const InternalTlsSection& tls);

// Channel credentials of a client of the internal plane (the router, tools, tests): presents
// cert_file and verifies the server against ca_file when tls.enabled(), else insecure.
StatusOr<std::shared_ptr<grpc::ChannelCredentials>> InternalChannelCredentials(const InternalTlsSection& tls);

// Server credentials of the router's public gRPC port: TLS with this certificate chain and key,
// no client certificate asked for. INVALID_ARGUMENT naming router.tls_cert_file / tls_key_file
// when one cannot be read or is not PEM.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(const std::string& cert_file,
                                                                          const std::string& key_file);

// Writes a fresh throwaway CA and one certificate it signs (EC P-256, valid 30 days, for server
// and client auth; SANs 127.0.0.1, ::1, localhost and `server_name` when not empty) into `dir`
// (ca.pem, cert.pem, key.pem with mode 0600) and returns the section naming them. For loopback
// clusters (`icecache cluster`) and tests; a deployment brings its own certificates.
StatusOr<InternalTlsSection> WriteThrowawayCertificates(const std::string& dir, const std::string& server_name = "");

}  // namespace icecache::cluster
