// router/openai_api.h: OpenAI request bodies onto GenerateRequest, responses and errors back into
// OpenAI's shapes (the HTTP transport itself is covered by cluster_openai_api_test).
#include <gtest/gtest.h>

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
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"n", 2}}, 400, "n"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"logprobs", true}}, 400, "logprobs"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"top_logprobs", 1}}, 400, "top_logprobs"},
      {chat, {{"model", "tiny"}, {"messages", msgs}, {"frequency_penalty", 1}}, 400, "frequency_penalty"},
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
  json r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kChatCompletions, "chatcmpl-1", 10, "tiny", c, u));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
  c.finish = v1::FINISH_REASON_LENGTH;
  r = json::parse(OpenAiResponseJson(OpenAiEndpoint::kCompletions, "cmpl-1", 10, "tiny", c, u));
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
