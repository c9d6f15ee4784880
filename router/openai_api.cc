#include "router/openai_api.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace icecache::router {
namespace {

namespace pb = ::icecache::v1;
using json = nlohmann::json;

json NullOr(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

// Fills *error and returns the status for a refused body field.
Status Refuse(ApiError* error, StatusCode code, const std::string& param, const std::string& message) {
  Status s(code, message);
  *error = ApiErrorFromStatus(s, param);
  return s;
}

bool IsInt(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

// Token ids of a prompt list, or false when `v` is not a list of integers.
bool TokenList(const json& v, pb::TokenIds* out) {
  if (!v.is_array() || v.empty()) return false;
  for (const auto& x : v) {
    if (!IsInt(x)) return false;
    const int64_t id = x.get<int64_t>();
    if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max()) return false;
    out->add_ids(static_cast<int32_t>(id));
  }
  return true;
}

}  // namespace

ApiError ApiErrorFromStatus(const Status& status, std::string param) {
  ApiError e;
  e.message = status.message();
  e.param = std::move(param);
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable_error";
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout_error";
      break;
    case StatusCode::kCancelled:
      e.http_status = 499;
      e.type = "cancelled";
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 501;
      e.type = "not_implemented_error";
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
      break;
  }
  return e;
}

std::string ApiErrorJson(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message}, {"type", e.type}, {"param", NullOr(e.param)}, {"code", NullOr(e.code)}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, std::string_view body,
                                           const OpenAiDefaults& defaults, ApiError* error) {
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Refuse(error, StatusCode::kInvalidArgument, "", "the request body is not valid JSON");
  }
  if (!j.is_object()) return Refuse(error, StatusCode::kInvalidArgument, "", "the request body must be a JSON object");
  OpenAiRequest out;
  pb::GenerateRequest& r = out.request;
  auto bad = [&](const std::string& param, const std::string& message) {
    return Refuse(error, StatusCode::kInvalidArgument, param, message);
  };
  auto field = [&](const char* name) -> const json* {
    auto it = j.find(name);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };

  const json* model = field("model");
  if (model == nullptr || !model->is_string()) return bad("model", "model is required (a string: GET /v1/models lists it)");
  if (model->get<std::string>() != defaults.served_model) {
    Status s = Refuse(error, StatusCode::kNotFound, "model",
                      "The model `" + model->get<std::string>() + "` does not exist: this server serves `" +
                          defaults.served_model + "`");
    error->code = "model_not_found";
    return s;
  }

  if (chat) {
    const json* messages = field("messages");
    if (messages == nullptr || !messages->is_array() || messages->empty()) {
      return bad("messages", "messages is required: a non-empty list of {\"role\", \"content\"}");
    }
    auto* list = r.mutable_messages();
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string param = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return bad(param, param + " must be an object {\"role\", \"content\"}");
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) return bad(param + ".role", param + ".role must be a string");
      auto content = m.find("content");
      std::string text;
      if (content == m.end() || content->is_null()) {
        return bad(param + ".content", param + ".content is required (tool calls are not supported)");
      } else if (content->is_string()) {
        text = content->get<std::string>();
      } else if (content->is_array()) {
        for (const auto& part : *content) {
          auto type = part.is_object() ? part.find("type") : part.end();
          auto t = part.is_object() ? part.find("text") : part.end();
          if (type == part.end() || *type != "text" || t == part.end() || !t->is_string()) {
            return bad(param + ".content", param + ".content: only text parts ({\"type\": \"text\", \"text\"}) are supported");
          }
          text += t->get<std::string>();
        }
      } else {
        return bad(param + ".content", param + ".content must be a string or a list of text parts");
      }
      auto* msg = list->add_messages();
      msg->set_role(role->get<std::string>());
      msg->set_content(std::move(text));
    }
  } else {
    const json* prompt = field("prompt");
    if (prompt == nullptr) return bad("prompt", "prompt is required");
    if (prompt->is_string()) {
      r.set_text(prompt->get<std::string>());
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.set_text((*prompt)[0].get<std::string>());
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array()) {
      if (!TokenList((*prompt)[0], r.mutable_token_ids())) return bad("prompt", "prompt[0] must be a non-empty list of token ids");
    } else if (prompt->is_array() && !prompt->empty() && IsInt((*prompt)[0])) {
      if (!TokenList(*prompt, r.mutable_token_ids())) return bad("prompt", "prompt must be a list of token ids");
    } else {
      return bad("prompt", "prompt must be a string, a list of one string, or a list of token ids (batches of "
                           "several prompts are not supported: send one request each)");
    }
    if (const json* echo = field("echo"); echo != nullptr && (!echo->is_boolean() || echo->get<bool>())) {
      return bad("echo", "echo is not supported");
    }
    if (const json* suffix = field("suffix"); suffix != nullptr) return bad("suffix", "suffix is not supported");
    if (const json* best = field("best_of"); best != nullptr && (!IsInt(*best) || best->get<int64_t>() != 1)) {
      return bad("best_of", "best_of must be 1");
    }
  }

  // Sampling: OpenAI's defaults (temperature 1, top_p 1).
  auto number = [&](const char* name, double* out) -> Status {
    if (const json* v = field(name)) {
      if (!v->is_number()) return bad(name, std::string(name) + " must be a number");
      *out = v->get<double>();
    }
    return Status::Ok();
  };
  double temperature = 1.0, top_p = 1.0, presence = 0, frequency = 0;
  ICE_RETURN_IF_ERROR(number("temperature", &temperature));
  ICE_RETURN_IF_ERROR(number("top_p", &top_p));
  ICE_RETURN_IF_ERROR(number("presence_penalty", &presence));
  ICE_RETURN_IF_ERROR(number("frequency_penalty", &frequency));
  if (presence != 0) return bad("presence_penalty", "presence_penalty is not supported (only 0)");
  if (frequency != 0) return bad("frequency_penalty", "frequency_penalty is not supported (only 0)");
  if (!(temperature >= 0 && temperature <= 2)) return bad("temperature", "temperature must be in [0, 2]");
  if (!(top_p > 0 && top_p <= 1)) return bad("top_p", "top_p must be in (0, 1]");
  auto* sp = r.mutable_sampling();
  sp->set_temperature(static_cast<float>(temperature));
  sp->set_top_p(static_cast<float>(top_p));
  if (const json* v = field("top_k")) {
    if (!IsInt(*v) || v->get<int64_t>() < -1 || v->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return bad("top_k", "top_k must be an integer >= -1 (-1 or 0 = off)");
    }
    sp->set_top_k(static_cast<int32_t>(std::max<int64_t>(0, v->get<int64_t>())));
  }
  if (const json* v = field("seed")) {
    if (!IsInt(*v)) return bad("seed", "seed must be an integer");
    const uint64_t seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
    sp->set_seed(seed == 0 ? kSeedZero : seed);
  }
  if (const json* v = field("n"); v != nullptr && (!IsInt(*v) || v->get<int64_t>() != 1)) {
    return bad("n", "n must be 1 (several choices per request are not supported: send one request each)");
  }
  if (const json* v = field("logprobs")) {
    const bool off = (v->is_boolean() && !v->get<bool>());
    if (!off) return bad("logprobs", "logprobs are not supported yet");
  }
  if (field("top_logprobs") != nullptr) return bad("top_logprobs", "top_logprobs are not supported yet");
  if (const json* v = field("logit_bias"); v != nullptr && !(v->is_object() && v->empty())) {
    return bad("logit_bias", "logit_bias is not supported");
  }
  if (chat) {
    if (field("tools") != nullptr || field("functions") != nullptr) return bad("tools", "tools are not supported");
    if (const json* v = field("response_format");
        v != nullptr && !(v->is_object() && v->value("type", std::string()) == "text")) {
      return bad("response_format", "response_format other than {\"type\": \"text\"} is not supported");
    }
  }
  if (const json* v = field("user"); v != nullptr && !v->is_string()) return bad("user", "user must be a string");

  // Length.
  const json* max_tokens = field("max_completion_tokens");
  const char* max_name = "max_completion_tokens";
  if (max_tokens == nullptr) {
    max_tokens = field("max_tokens");
    max_name = "max_tokens";
  }
  if (max_tokens != nullptr) {
    if (!IsInt(*max_tokens) || max_tokens->get<int64_t>() < 1 ||
        max_tokens->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return bad(max_name, std::string(max_name) + " must be an integer >= 1");
    }
    r.set_max_tokens(static_cast<int32_t>(max_tokens->get<int64_t>()));
  } else {
    r.set_max_tokens(chat ? defaults.chat_max_tokens : defaults.completions_max_tokens);
  }

  // Stops.
  if (const json* stop = field("stop")) {
    if (stop->is_string()) {
      r.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& s : *stop) {
        if (!s.is_string()) return bad("stop", "stop must be a string or a list of strings");
        r.add_stop(s.get<std::string>());
      }
    } else {
      return bad("stop", "stop must be a string or a list of strings");
    }
  }
  if (const json* ids = field("stop_token_ids")) {
    pb::TokenIds t;
    if (!ids->is_array() || (!ids->empty() && !TokenList(*ids, &t))) {
      return bad("stop_token_ids", "stop_token_ids must be a list of token ids");
    }
    r.mutable_stop_token_ids()->CopyFrom(t.ids());
  }
  if (const json* v = field("ignore_eos")) {
    if (!v->is_boolean()) return bad("ignore_eos", "ignore_eos must be true or false");
    r.set_ignore_eos(v->get<bool>());
  }
  if (const json* v = field("budget_pages")) {
    if (v->is_string() && v->get<std::string>() == "full") {
      r.mutable_cache()->set_full(true);
    } else if (IsInt(*v) && v->get<int64_t>() >= 1 && v->get<int64_t>() <= std::numeric_limits<int32_t>::max()) {
      r.mutable_cache()->set_budget_pages(static_cast<int32_t>(v->get<int64_t>()));
    } else {
      return bad("budget_pages", "budget_pages must be a positive integer or \"full\"");
    }
  }

  if (const json* v = field("stream")) {
    if (!v->is_boolean()) return bad("stream", "stream must be true or false");
    out.stream = v->get<bool>();
  }
  if (const json* v = field("stream_options")) {
    if (!v->is_object()) return bad("stream_options", "stream_options must be an object");
    if (!out.stream) return bad("stream_options", "stream_options is only allowed with stream: true");
    auto u = v->find("include_usage");
    if (u != v->end() && !u->is_null()) {
      if (!u->is_boolean()) return bad("stream_options.include_usage", "include_usage must be true or false");
      out.include_usage = u->get<bool>();
    }
  }
  return out;
}

const char* OpenAiFinishReason(pb::FinishReason reason) {
  switch (reason) {
    case pb::FINISH_REASON_LENGTH:
      return "length";
    case pb::FINISH_REASON_EOS:
    case pb::FINISH_REASON_STOP:
      return "stop";
    default:
      return nullptr;
  }
}

namespace {

json UsageJson(const pb::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()}};
}

json FinishJson(pb::FinishReason reason) {
  const char* f = OpenAiFinishReason(reason);
  return f == nullptr ? json(nullptr) : json(f);
}

// Text from the request path is complete UTF-8; replace guards the dump anyway.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string OpenAiResponseJson(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                               const std::string& model, const OpenAiChoice& choice, const pb::Usage& usage) {
  json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishJson(choice.finish)}};
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  if (chat) {
    c["message"] = {{"role", "assistant"}, {"content", choice.text}};
  } else {
    c["text"] = choice.text;
  }
  json j = {{"id", id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({c})},
            {"usage", UsageJson(usage)}};
  return Dump(j);
}

std::string OpenAiChunkEvent(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                             const std::string& model, const OpenAiChoice& choice, bool include_usage) {
  json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishJson(choice.finish)}};
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  if (chat) {
    json delta = json::object();
    if (choice.first_chunk) delta["role"] = "assistant";
    if (!choice.text.empty() || choice.first_chunk) delta["content"] = choice.text;
    c["delta"] = delta;
  } else {
    c["text"] = choice.text;
  }
  json j = {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array({c})}};
  if (include_usage) j["usage"] = nullptr;
  return "data: " + Dump(j) + "\n\n";
}

std::string OpenAiUsageChunkEvent(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                                  const std::string& model, const pb::Usage& usage) {
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  json j = {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array()},
            {"usage", UsageJson(usage)}};
  return "data: " + Dump(j) + "\n\n";
}

std::string OpenAiModelsJson(const std::string& model, int64_t created) {
  json j = {{"object", "list"},
            {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "icecache"}}})}};
  return Dump(j);
}

}  // namespace icecache::router
