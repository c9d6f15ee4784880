// Client side of the public API: `icecache generate --router HOST:PORT` and `icecache health`
// use these; they hide the generated gRPC code.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace icecache::router {

struct RemoteGenerateOptions {
  std::string router;                   // HOST:PORT
  std::optional<std::string> prompt;    // text (with chat: the user message), or
  std::vector<int32_t> prompt_ids;      // token ids
  int max_tokens = 64;
  float temperature = 0.f;
  float presence_penalty = 0.f;   // [-2, 2]
  float frequency_penalty = 0.f;  // [-2, 2]
  float top_p = 1.f;
  int top_k = 0;
  uint64_t seed = 0;                    // 0 = router picks
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
  bool ignore_eos = false;
  int budget_pages = -1;                // -1 = cluster default, 0 = full, else pages
  double timeout_seconds = 0;           // 0 = none
  std::string api_key;                  // sent as metadata "authorization: Bearer KEY"; empty = none
  std::string tls_ca_file;              // TLS to the router, its certificate verified against this
                                        // PEM CA (router.tls_cert_file); empty = plaintext
  std::string cache_salt;               // KV reuse isolation (GenerateRequest.cache_salt)
  bool chat = false;                    // send `prompt` as one user message: the router applies
                                        // the model's chat template (FAILED_PRECONDITION without one)
};

struct RemoteChunk {
  std::string text;              // new text
  std::vector<int32_t> token_ids;
  bool last = false;
  // last chunk only:
  std::string finish_reason;     // "length", "eos", "stop"
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;         // prompt tokens whose KV was reused (usage.cached_tokens)
  double ttft_seconds = 0, tpot_seconds = 0, e2e_seconds = 0;
  double prefill_compute_seconds = 0, tree_build_seconds = 0, transfer_seconds = 0;
  int64_t pages_fetched = 0;
  int64_t transfer_bytes = 0;
  std::string decode_worker;     // first chunk only
};

// Streams one generation; `on_chunk` is called for each response (returning false cancels the
// call). Returns the call's status (gRPC codes, message from the server).
Status RunRemoteGenerate(const RemoteGenerateOptions& options, const std::function<bool(const RemoteChunk&)>& on_chunk);

// Checks grpc.health.v1 on `address` for `service` ("" = the whole server). OK when SERVING.
Status CheckHealth(const std::string& address, const std::string& service, double timeout_seconds);

}  // namespace icecache::router

namespace icecache::router {

// The body of `icecache generate --router HOST:PORT`: streams text to stdout (or, with
// print_ids, the token ids comma-separated at the end), then a one-line summary with usage and
// timing to stderr. Returns the process exit code (0 ok, 1 error).
int PrintRemoteGeneration(const RemoteGenerateOptions& options, bool print_ids);

}  // namespace icecache::router
