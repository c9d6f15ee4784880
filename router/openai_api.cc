#include "router/openai_api.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "router/request_checks.h"

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
  if (!(presence >= -2 && presence <= 2)) return bad("presence_penalty", "presence_penalty must be in [-2, 2]");
  if (!(frequency >= -2 && frequency <= 2)) return bad("frequency_penalty", "frequency_penalty must be in [-2, 2]");
  if (!(temperature >= 0 && temperature <= 2)) return bad("temperature", "temperature must be in [0, 2]");
  if (!(top_p > 0 && top_p <= 1)) return bad("top_p", "top_p must be in (0, 1]");
  auto* sp = r.mutable_sampling();
  sp->set_temperature(static_cast<float>(temperature));
  sp->set_top_p(static_cast<float>(top_p));
  sp->set_presence_penalty(static_cast<float>(presence));
  sp->set_frequency_penalty(static_cast<float>(frequency));
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
  int n = 1;
  if (const json* v = field("n")) {
    if (!IsInt(*v) || v->get<int64_t>() < 1 || v->get<int64_t>() > kMaxChoices) {
      return bad("n", "n must be an integer in [1, " + std::to_string(kMaxChoices) + "]");
    }
    n = static_cast<int>(v->get<int64_t>());
  }
  if (const json* best = field("best_of"); !chat && best != nullptr && (!IsInt(*best) || best->get<int64_t>() != n)) {
    return bad("best_of", "best_of must equal n (icecache returns every sequence it generates)");
  }
  if (n > 1) r.set_n(n);
  if (const json* v = field("cache_salt")) {
    if (!v->is_string()) return bad("cache_salt", "cache_salt must be a string");
    r.set_cache_salt(v->get<std::string>());
  }
  const std::string max_top = std::to_string(kMaxTopLogprobs);
  if (chat) {
    bool want = false;
    if (const json* v = field("logprobs")) {
      if (!v->is_boolean()) return bad("logprobs", "logprobs must be true or false (chat); use top_logprobs for the count");
      want = v->get<bool>();
    }
    if (const json* v = field("top_logprobs")) {
      if (!IsInt(*v) || v->get<int64_t>() < 0 || v->get<int64_t>() > kMaxTopLogprobs) {
        return bad("top_logprobs", "top_logprobs must be an integer in [0, " + max_top + "]");
      }
      if (!want) return bad("top_logprobs", "top_logprobs needs logprobs: true");
      sp->set_top_logprobs(static_cast<int32_t>(v->get<int64_t>()));
    }
    sp->set_logprobs(want);
  } else {
    if (const json* v = field("logprobs")) {
      if (!IsInt(*v) || v->get<int64_t>() < 0 || v->get<int64_t>() > kMaxTopLogprobs) {
        return bad("logprobs", "logprobs must be an integer in [0, " + max_top + "] (top entries per token)");
      }
      sp->set_logprobs(true);
      sp->set_top_logprobs(static_cast<int32_t>(v->get<int64_t>()));
    }
    if (field("top_logprobs") != nullptr) {
      return bad("top_logprobs", "top_logprobs is a chat field: /v1/completions takes logprobs: <count>");
    }
  }
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
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

json FinishJson(pb::FinishReason reason) {
  const char* f = OpenAiFinishReason(reason);
  return f == nullptr ? json(nullptr) : json(f);
}

// Text from the request path is complete UTF-8; replace guards the dump anyway.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

namespace {

constexpr float kMinLogprob = -9999.f;

float Finite(float lp) { return std::isfinite(lp) ? lp : kMinLogprob; }

json Bytes(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(static_cast<int>(c));
  return a;
}

// The choice's "logprobs": null, or completions' legacy object {tokens, token_logprobs,
// top_logprobs, text_offset}, or chat's {content: [{token, logprob, bytes, top_logprobs}]}.
json LogprobsJson(bool chat, const OpenAiChoice& c) {
  if (!c.logprobs) return nullptr;
  if (chat) {
    json content = json::array();
    for (const auto& t : c.token_logprobs) {
      json top = json::array();
      for (const auto& e : t.top) {
        top.push_back({{"token", e.token}, {"logprob", Finite(e.logprob)}, {"bytes", Bytes(e.bytes)}});
      }
      content.push_back({{"token", t.sampled.token},
                         {"logprob", Finite(t.sampled.logprob)},
                         {"bytes", Bytes(t.sampled.bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  int64_t offset = c.text_offset;
  for (const auto& t : c.token_logprobs) {
    tokens.push_back(t.sampled.token);
    token_logprobs.push_back(Finite(t.sampled.logprob));
    // As vLLM: the top entries and the sampled token.
    json top = json::object();
    // Two ids with the same text (e.g. partial UTF-8 pieces) keep the more likely one's value.
    for (const auto& e : t.top) {
      if (!top.contains(e.token)) top[e.token] = Finite(e.logprob);
    }
    if (!top.contains(t.sampled.token)) top[t.sampled.token] = Finite(t.sampled.logprob);
    top_logprobs.push_back(top);
    text_offset.push_back(offset);
    offset += static_cast<int64_t>(t.sampled.token.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", text_offset}};
}

}  // namespace

std::vector<OpenAiTokenLogprob> ResolveLogprobs(const pb::GenerateResponse& r, const tokenizer::Tokenizer* tok) {
  auto entry = [tok](int32_t id, float logprob) {
    OpenAiTokenLogprob::Entry e;
    e.logprob = logprob;
    const int32_t ids[1] = {id};
    auto text = tok != nullptr ? tok->Decode(ids) : StatusOr<std::string>(Status(StatusCode::kNotFound, ""));
    auto bytes = tok != nullptr ? tok->DecodeBytes(ids) : StatusOr<std::string>(Status(StatusCode::kNotFound, ""));
    if (text.ok() && bytes.ok()) {
      e.token = std::move(*text);
      e.bytes = std::move(*bytes);
    } else {
      e.token = e.bytes = "token_id:" + std::to_string(id);
    }
    return e;
  };
  std::vector<OpenAiTokenLogprob> out;
  const int n = std::min(r.token_ids_size(), r.logprobs_size());
  for (int i = 0; i < n; ++i) {
    const pb::TokenLogprob& l = r.logprobs(i);
    OpenAiTokenLogprob t;
    t.sampled = entry(r.token_ids(i), l.logprob());
    for (int k = 0; k < std::min(l.top_ids_size(), l.top_logprobs_size()); ++k) {
      t.top.push_back(entry(l.top_ids(k), l.top_logprobs(k)));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string OpenAiResponseJson(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                               const std::string& model, const std::vector<OpenAiChoice>& choices,
                               const pb::Usage& usage) {
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  json list = json::array();
  for (const OpenAiChoice& choice : choices) {
    json c = {{"index", choice.index}, {"logprobs", LogprobsJson(chat, choice)}, {"finish_reason", FinishJson(choice.finish)}};
    if (chat) {
      c["message"] = {{"role", "assistant"}, {"content", choice.text}};
    } else {
      c["text"] = choice.text;
    }
    list.push_back(std::move(c));
  }
  json j = {{"id", id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", list},
            {"usage", UsageJson(usage)}};
  return Dump(j);
}

std::string OpenAiChunkEvent(OpenAiEndpoint endpoint, const std::string& id, int64_t created,
                             const std::string& model, const OpenAiChoice& choice, bool include_usage) {
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  json c = {{"index", choice.index}, {"logprobs", LogprobsJson(chat, choice)}, {"finish_reason", FinishJson(choice.finish)}};
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
