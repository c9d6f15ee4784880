// The OpenAI-compatible HTTP API's JSON (docs/openai_api.md): request bodies of /v1/completions
// and /v1/chat/completions mapped onto a v1::GenerateRequest, the request path's responses mapped
// back into OpenAI's response, chunk and error shapes, and icecache Status codes mapped onto HTTP
// statuses. Pure functions over strings and protos; the transport is router/http_server.h.
//
// Checks done here are those of the JSON itself (types, OpenAI fields icecache does not support);
// everything a GenerateRequest must satisfy (ranges, sizes, UTF-8, the chat template) is checked
// by the request path, the same way for gRPC and HTTP.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "icecache/v1/generation.pb.h"

namespace icecache::tokenizer {
class Tokenizer;
}

namespace icecache::router {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// OpenAI's error object {"error": {"message", "type", "param", "code"}} and its HTTP status.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // "invalid_request_error", "not_found_error", ...
  std::string param;  // the offending body field, "" = null
  std::string code;   // "" = null
};

// INVALID_ARGUMENT and FAILED_PRECONDITION -> 400, NOT_FOUND -> 404, UNAUTHENTICATED -> 401,
// RESOURCE_EXHAUSTED -> 429, UNAVAILABLE -> 503, DEADLINE_EXCEEDED -> 504, CANCELLED -> 499,
// UNIMPLEMENTED -> 501, anything else -> 500.
ApiError ApiErrorFromStatus(const Status& status, std::string param = "");
std::string ApiErrorJson(const ApiError& error);

// Limits that the JSON mapping itself needs.
struct OpenAiDefaults {
  std::string served_model;        // the one model id; another is 404 model_not_found
  int completions_max_tokens = 16;  // OpenAI's default for /v1/completions
  int chat_max_tokens = 4096;       // used when a chat request sets no max_tokens
};

struct OpenAiRequest {
  v1::GenerateRequest request;  // prompt / messages, sampling, stop, cache policy, max_tokens
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
};

// Parses a request body. Fields: model (must equal defaults.served_model), prompt (string, a list
// of one string, a list of token ids, or a list of one list of token ids) or messages
// ([{role, content}], content a string or a list of {"type": "text", "text"} parts), max_tokens /
// max_completion_tokens, temperature (default 1), top_p, seed, stop (string or list), n (1 ..
// kMaxChoices), presence_penalty / frequency_penalty ([-2, 2]), logprobs (completions: an
// integer 0 .. 20 top entries; chat: a boolean, with top_logprobs 0 .. 20), echo (false),
// best_of (1, or equal to n), user, stream, stream_options.include_usage; icecache extras top_k
// (-1 or 0 = off), budget_pages (an int or "full"), ignore_eos, stop_token_ids. Unknown fields
// are ignored (as OpenAI and vLLM do). Errors: ApiError 400 naming the param, 404 for another
// model. `seed` 0 is sent as kSeedZero (the GenerateRequest's 0 means "the router picks one").
StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, std::string_view body,
                                           const OpenAiDefaults& defaults, ApiError* error);
inline constexpr uint64_t kSeedZero = 0x9e3779b97f4a7c15ull;

// OpenAI's finish_reason for a FinishReason: EOS and STOP -> "stop", LENGTH -> "length".
const char* OpenAiFinishReason(v1::FinishReason reason);

// One token's logprobs with the token strings resolved: `token` is the token's text
// (Tokenizer::Decode of the one id; "token_id:N" without a tokenizer), `bytes` its raw bytes.
// A logprob of -inf is written as -9999.0 (JSON has no infinity; vLLM does the same).
struct OpenAiTokenLogprob {
  struct Entry {
    std::string token;
    std::string bytes;
    float logprob = 0.f;
  };
  Entry sampled;
  std::vector<Entry> top;  // by descending logprob
};

// The logprobs of the tokens of one response (response.logprobs, one per token_ids entry).
std::vector<OpenAiTokenLogprob> ResolveLogprobs(const v1::GenerateResponse& response,
                                                const tokenizer::Tokenizer* tokenizer);

// The pieces of one choice of a response (non-streamed) or chunk (streamed).
struct OpenAiChoice {
  int index = 0;
  std::string text;            // text (completions), message.content / delta.content (chat)
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;  // UNSPECIFIED = null
  bool first_chunk = false;    // chat chunks: the first carries delta.role
  bool logprobs = false;       // asked for: "logprobs" is an object (else null)
  std::vector<OpenAiTokenLogprob> token_logprobs;  // the tokens of this response / chunk
  // Completions' text_offset: where the first token of token_logprobs starts in the choice's
  // text (the byte length of the token strings before it).
  int64_t text_offset = 0;
};

// A whole non-streamed response body; choices in the order given (by index).
std::string OpenAiResponseJson(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                               const std::string& model, const std::vector<OpenAiChoice>& choices,
                               const v1::Usage& usage);
// One streamed chunk as an SSE event ("data: {...}\n\n"). With include_usage every chunk has
// "usage": null, and UsageChunkEvent gives the last one (empty choices, the usage).
std::string OpenAiChunkEvent(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                             const std::string& model, const OpenAiChoice& choice, bool include_usage);
std::string OpenAiUsageChunkEvent(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                                  const std::string& model, const v1::Usage& usage);

// GET /v1/models.
std::string OpenAiModelsJson(const std::string& model, int64_t created);

}  // namespace icecache::router
