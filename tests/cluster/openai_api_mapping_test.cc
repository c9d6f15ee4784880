// router/openai_api.h: OpenAI request bodies onto GenerateRequest, responses and errors back into
// OpenAI's shapes (the HTTP transport itself is covered by cluster_openai_api_test).
#include <gtest/gtest.h>

#include <limits>

#include <nlohmann/json.hpp>

#include "router/openai_api.h"

namespace icecache::router {
namespace {

using json = nlohmann::json;

OpenAiDefaults Defaults() {
  OpenAiDefaults d;
  d.served_model = "tiny";
  d.chat_max_tokens = 100;
  return d;
}

StatusOr<OpenAiRequest> Parse(OpenAiEndpoint e, const json& body, ApiError* err) {
  return ParseOpenAiRequest(e, body.dump(), Defaults(), err);
}

TEST(OpenAiMapping, CompletionFields) {
  ApiError err;
  auto r = Parse(OpenAiEndpoint::kCompletions,
                 {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9},
                  {"seed", 42}, {"stop", {"a", "b"}}, {"n", 1}, {"presence_penalty", 0}, {"user", "u"},
                  {"top_k", 5}, {"budget_pages", 9}, {"ignore_eos", true}, {"stop_token_ids", {3, 4}},
                  {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"some_unknown_field", 1}},
                 &err);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& g = r->request;
  EXPECT_EQ(g.text(), "hi");
  EXPECT_EQ(g.max_tokens(), 7);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().seed(), 42u);
  EXPECT_EQ(g.sampling().top_k(), 5);
  ASSERT_EQ(g.stop_size(), 2);
  EXPECT_EQ(g.stop(1), "b");
  EXPECT_EQ(g.cache().budget_pages(), 9);
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_EQ(g.stop_token_ids_size(), 2);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(g.n(), 0);  // n = 1 is the default one choice
  EXPECT_FALSE(g.sampling().logprobs());
  EXPECT_EQ(g.sampling().presence_penalty(), 0.f);
}

TEST(OpenAiMapping, PenaltiesLogprobsAndN) {
  ApiError err;
  auto r = Parse(OpenAiEndpoint::kCompletions,
                 {{"model", "tiny"}, {"prompt", "hi"}, {"presence_penalty", -2}, {"frequency_penalty", 1.5},
                  {"logprobs", 5}, {"n", 3}, {"best_of", 3}},
                 &err);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FLOAT_EQ(r->request.sampling().presence_penalty(), -2.f);
  EXPECT_FLOAT_EQ(r->request.sampling().frequency_penalty(), 1.5f);
  EXPECT_TRUE(r->request.sampling().logprobs());
  EXPECT_EQ(r->request.sampling().top_logprobs(), 5);
  EXPECT_EQ(r->request.n(), 3);
  r = Parse(OpenAiEndpoint::kCompletions, {{"model", "tiny"}, {"prompt", "hi"}, {"logprobs", 0}}, &err);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->request.sampling().logprobs());
  EXPECT_EQ(r->request.sampling().top_logprobs(), 0);
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  r = Parse(OpenAiEndpoint::kChatCompletions,
            {{"model", "tiny"}, {"messages", msgs}, {"logprobs", true}, {"top_logprobs", 20}, {"n", 16}}, &err);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->request.sampling().logprobs());
  EXPECT_EQ(r->request.sampling().top_logprobs(), 20);
  EXPECT_EQ(r->request.n(), 16);
  r = Parse(OpenAiEndpoint::kChatCompletions, {{"model", "tiny"}, {"messages", msgs}, {"logprobs", false}}, &err);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->request.sampling().logprobs());
}

TEST(OpenAiMapping, LogprobsShapes) {
  v1::GenerateResponse resp;
  resp.add_token_ids(7);
  resp.add_token_ids(9);
  for (float lp : {-0.5f, -std::numeric_limits<float>::infinity()}) {
    auto* l = resp.add_logprobs();
    l->set_logprob(lp);
    l->add_top_ids(3);
    l->add_top_logprobs(-0.25f);
    l->add_top_ids(7);
    l->add_top_logprobs(-0.5f);
  }
  // Without a tokenizer the token strings are "token_id:N".
  auto lps = ResolveLogprobs(resp, nullptr);
  ASSERT_EQ(lps.size(), 2u);
  EXPECT_EQ(lps[0].sampled.token, "token_id:7");
  ASSERT_EQ(lps[0].top.size(), 2u);
  EXPECT_EQ(lps[0].top[0].token, "token_id:3");
  OpenAiChoice c;
  c.index = 1;
  c.logprobs = true;
  c.token_logprobs = lps;
  c.text_offset = 4;
  v1::Usage u;
  json r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kCompletions, "cmpl-1", 10, "tiny", {c}, u));
  const json& l = r["choices"][0]["logprobs"];
  EXPECT_EQ(r["choices"][0]["index"], 1);
  EXPECT_EQ(l["tokens"], json({"token_id:7", "token_id:9"}));
  EXPECT_FLOAT_EQ(l["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(l["token_logprobs"][1].get<float>(), -9999.f);  // -inf: JSON has no infinity
  EXPECT_EQ(l["text_offset"], json({4, 4 + 10}));
  EXPECT_EQ(l["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(l["top_logprobs"][1].size(), 3u);  // the sampled token joins the top entries (as vLLM)
  r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", {c}, u));
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "token_id:7");
  EXPECT_EQ(content[0]["bytes"].size(), std::string("token_id:7").size());
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "token_id:3");
  c.logprobs = false;
  r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", {c}, u));
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  std::string e = OpenAiChunkEvent(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", c, false);
  EXPECT_EQ(json::parse(e.substr(6))["choices"][0]["index"], 1);
}

TEST(OpenAiMapping, DefaultsAndPromptForms) {
  ApiError err;
  auto r = Parse(OpenAiEndpoint::kCompletions, {{"model", "tiny"}, {"prompt", {1, 2, 3}}, {"seed", 0}}, &err);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request.token_ids().ids_size(), 3);
  EXPECT_EQ(r->request.max_tokens(), 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(r->request.sampling().temperature(), 1.f);
  EXPECT_EQ(r->request.sampling().seed(), kSeedZero);  // seed 0 is a fixed seed, not "pick one"
  r = Parse(OpenAiEndpoint::kCompletions, {{"model", "tiny"}, {"prompt", {{5, 6}}}, {"budget_pages", "full"}}, &err);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request.token_ids().ids_size(), 2);
  EXPECT_TRUE(r->request.cache().full());
  r = Parse(OpenAiEndpoint::kCompletions, {{"model", "tiny"}, {"prompt", {"one"}}, {"top_k", -1}}, &err);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request.text(), "one");
  EXPECT_EQ(r->request.sampling().top_k(), 0);
}

TEST(OpenAiMapping, ChatMessages) {
  ApiError err;
  auto r = Parse(OpenAiEndpoint::kChatCompletions,
                 {{"model", "tiny"},
                  {"messages",
                   {{{"role", "system"}, {"content", "s"}},
                    {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
                  {"max_completion_tokens", 9},
                  {"max_tokens", 3}},
                 &err);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->request.messages().messages_size(), 2);
  EXPECT_EQ(r->request.messages().messages(1).role(), "user");
  EXPECT_EQ(r->request.messages().messages(1).content(), "ab");
  EXPECT_EQ(r->request.max_tokens(), 9);  // max_completion_tokens wins
  r = Parse(OpenAiEndpoint::kChatCompletions, {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}},
            &err);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request.max_tokens(), 100);  // the chat default from OpenAiDefaults
}

TEST(OpenAiMapping, RefusalsNameTheParam) {
  struct Case {
    OpenAiEndpoint e;
    json body;
    int status;
    std::string param;
  };
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  const auto chat = OpenAiEndpoint::kChatCompletions;
  const auto cmpl = OpenAiEndpoint::kCompletions;
  std::vector<Case> cases = {
      {chat, {{"model", "other"}, {"messages", msgs}}, 404, "model"},
      {chat, {{"messages", msgs}}, 400, "model"},
      {chat, {{"model", "tiny"}}, 400, "messages"},
      {chat, {{"model", "tiny"}, {"messages", json::array()}}, 400, "messages"},
      {chat, {{"model", "tiny"}, {"messages", {{{"role", "user"}}}}}, 400, "messages[0].content"},
      {chat, {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, 400,
       "messages[0].content"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"n", 0}}, 400, "n"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"n", 17}}, 400, "n"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"n", 1.5}}, 400, "n"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"logprobs", 3}}, 400, "logprobs"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"top_logprobs", 1}}, 400, "top_logprobs"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}, 400, "top_logprobs"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"logprobs", true}, {"top_logprobs", -1}}, 400, "top_logprobs"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"frequency_penalty", 2.5}}, 400, "frequency_penalty"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"presence_penalty", -2.01}}, 400, "presence_penalty"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"presence_penalty", "high"}}, 400, "presence_penalty"},
      {cmpl, {{"model", "tiny"}, {"prompt", "a"}, {"logprobs", 21}}, 400, "logprobs"},
      {cmpl, {{"model", "tiny"}, {"prompt", "a"}, {"logprobs", true}}, 400, "logprobs"},
      {cmpl, {{"model", "tiny"}, {"prompt", "a"}, {"top_logprobs", 2}}, 400, "top_logprobs"},
      {cmpl, {{"model", "tiny"}, {"prompt", "a"}, {"n", 2}, {"best_of", 3}}, 400, "best_of"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"temperature", "hot"}}, 400, "temperature"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"temperature", 3}}, 400, "temperature"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"top_p", 0}}, 400, "top_p"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"max_tokens", 0}}, 400, "max_tokens"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"stop", 5}}, 400, "stop"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"budget_pages", -1}}, 400, "budget_pages"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"tools", json::array()}}, 400, "tools"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"stream_options", {{"include_usage", true}}}}, 400,
       "stream_options"},
      {cmpl, {{"model", "tiny"}, {"prompt", {"a", "b"}}}, 400, "prompt"},
      {cmpl, {{"model", "tiny"}, {"prompt", {1, "b"}}}, 400, "prompt"},
      {cmpl, {{"model", "tiny"}, {"prompt", "a"}, {"echo", true}}, 400, "echo"},
      {cmpl, {{"model", "tiny"}, {"prompt", "a"}, {"best_of", 2}}, 400, "best_of"},
  };
  for (const auto& c : cases) {
    ApiError err;
    auto r = Parse(c.e, c.body, &err);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    EXPECT_EQ(err.http_status, c.status) << c.body.dump();
    EXPECT_EQ(err.param, c.param) << c.body.dump();
    EXPECT_FALSE(err.message.empty());
  }
  ApiError err;
  EXPECT_FALSE(ParseOpenAiRequest(chat, "{not json", Defaults(), &err).ok());
  EXPECT_EQ(err.http_status, 400);
  EXPECT_FALSE(ParseOpenAiRequest(chat, "[1]", Defaults(), &err).ok());
  EXPECT_EQ(err.http_status, 400);
}

TEST(OpenAiMapping, StatusesAndErrorShape) {
  EXPECT_EQ(ApiErrorFromStatus(InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(ApiErrorFromStatus(FailedPreconditionError("x")).http_status, 400);
  EXPECT_EQ(ApiErrorFromStatus(NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(ApiErrorFromStatus(UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(DeadlineExceededError("x")).http_status, 504);
  EXPECT_EQ(ApiErrorFromStatus(InternalError("x")).http_status, 500);
  json j = json::parse(ApiErrorJson(ApiErrorFromStatus(InvalidArgumentError("bad n"), "n")));
  EXPECT_EQ(j["error"]["message"], "bad n");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiMapping, ResponseAndChunkShapes) {
  v1::Usage u;
  u.set_prompt_tokens(3);
  u.set_completion_tokens(4);
  OpenAiChoice c;
  c.text = "hello";
  c.finish = v1::FINISH_REASON_EOS;
  json r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", {c}, u));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
  c.finish = v1::FINISH_REASON_LENGTH;
  r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kCompletions, "cmpl-1", 10, "tiny", {c}, u));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");

  c.finish = v1::FINISH_REASON_UNSPECIFIED;
  c.first_chunk = true;
  std::string e = OpenAiChunkEvent(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", c, true);
  ASSERT_EQ(e.rfind("data: ", 0), 0u);
  ASSERT_EQ(e.substr(e.size() - 2), "\n\n");
  json k = json::parse(e.substr(6));
  EXPECT_EQ(k["object"], "chat.completion.chunk");
  EXPECT_EQ(k["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(k.contains("usage") && k["usage"].is_null());
  e = OpenAiUsageChunkEvent(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", u);
  k = json::parse(e.substr(6));
  EXPECT_TRUE(k["choices"].empty());
  EXPECT_EQ(k["usage"]["completion_tokens"], 4);
  json m = json::parse(OpenAiModelsJson("tiny", 1));
  EXPECT_EQ(m["data"][0]["id"], "tiny");
}

}  // namespace
}  // namespace icecache::router
