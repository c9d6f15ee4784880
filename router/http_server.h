// The router's OpenAI-compatible HTTP API (docs/openai_api.md), over cpp-httplib (Debian's
// libcpp-httplib-dev): POST /v1/completions, POST /v1/chat/completions (stream: true as
// server-sent events ending in "data: [DONE]"), GET /v1/models, GET /health. Every generation
// goes through the same RequestPath as the gRPC API (router/request_path.h); this layer only maps
// JSON (router/openai_api.h) and moves bytes.
//
// Connections: a pool of `threads` threads serves connections (HTTP/1.1 keep-alive); a streamed
// response holds its thread until it ends. The generation of a streamed request runs on its own
// thread and hands events to the connection through a queue of at most kMaxQueuedEvents events:
// a client that reads slowly stalls only its own generation (and, past the write timeout, loses
// it), never another connection. A client that disconnects cancels its generation on the workers
// (noticed at the next event or at the idle heartbeat, an SSE comment every few seconds).
// Limits: bodies above `max_body_bytes` -> 413; request line and header limits are cpp-httplib's
// (8 KiB per line, 100 header lines).
//
// Thread safety: Shutdown may be called from any thread, once or more.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace icecache::router {

class RequestPath;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                  // 0 = any free port (see HttpServer::port)
  std::string model_name;        // the model id of /v1/models; requests naming another are 404
  int threads = 256;             // connections served at once
  int64_t max_body_bytes = 16 << 20;
  double idle_keepalive_seconds = 5;  // an idle keep-alive connection is closed after this long
  double write_timeout_seconds = 30;  // a client that takes no bytes for this long loses its stream
  // HTTPS with this PEM certificate chain and key (both or neither; "" = plain HTTP).
  std::string tls_cert_file;
  std::string tls_key_file;
};

class HttpServer {
 public:
  static constexpr size_t kMaxQueuedEvents = 256;

  // Binds and starts serving in the background. `path` must outlive the server; `healthy` says
  // whether GET /health answers 200 (else 503). INVALID_ARGUMENT naming router.tls_cert_file /
  // tls_key_file when the TLS files cannot be loaded.
  static StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, RequestPath* path,
                                                     std::function<bool()> healthy);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Stops accepting, cancels running generations and waits for the serving thread.
  void Shutdown();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace icecache::router
