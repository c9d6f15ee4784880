#include "router/http_server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "common/logging.h"
#include "router/openai_api.h"
#include "router/request_path.h"

namespace icecache::router {
namespace {

namespace pb = ::icecache::v1;
using Clock = std::chrono::steady_clock;

constexpr auto kHeartbeat = std::chrono::seconds(2);  // SSE comment while no event comes
constexpr const char* kJson = "application/json";

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(ApiErrorJson(e), kJson);
}

std::string RequestId(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%s%016llx%08llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}

RequestContext::Clock::time_point DeadlineFrom(const RequestPath& path) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(path.config().router.request_timeout_seconds));
}

// A streamed request: its generation runs on `thread` and leaves SSE events in `events`; the
// connection's thread writes them out. Destruction cancels the generation and joins the thread.
struct Stream {
  Stream(Clock::time_point deadline, std::string authorization) : ctx(deadline, std::move(authorization)) {}
  ~Stream() {
    ctx.Cancel();
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
  CancellableRequestContext ctx;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> events;  // guarded by mu
  bool started = false;            // guarded by mu: the first response came
  bool finished = false;           // guarded by mu: Generate returned (status below)
  Status status;                   // guarded by mu
  std::thread thread;
};

// What the sinks need to know of the request.
struct ChoiceShape {
  int n = 1;                 // choices
  bool logprobs = false;     // sampling.logprobs asked for
  const tokenizer::Tokenizer* tokenizer = nullptr;
};

// Turns the request path's responses into SSE events, blocking while the queue is full. With
// n > 1 the usage chunk comes once every choice has finished: prompt tokens once, completion
// tokens summed.
class StreamSink final : public ResponseSink {
 public:
  StreamSink(Stream* s, OpenAiEndpoint endpoint, std::string id, int64_t created, std::string model, bool usage,
             ChoiceShape shape)
      : s_(s), endpoint_(endpoint), id_(std::move(id)), created_(created), model_(std::move(model)), usage_(usage),
        shape_(shape), first_(shape.n, true), offsets_(shape.n, 0) {}

  bool Write(const pb::GenerateResponse& r) override {
    std::vector<std::string> out;
    const int index = r.index();
    if (index < 0 || index >= shape_.n) return false;
    OpenAiChoice c;
    c.index = index;
    c.text = r.text();
    c.finish = r.finish_reason();
    c.first_chunk = first_[index];
    c.logprobs = shape_.logprobs;
    if (shape_.logprobs) {
      c.token_logprobs = ResolveLogprobs(r, shape_.tokenizer);
      c.text_offset = offsets_[index];
      for (const auto& t : c.token_logprobs) offsets_[index] += static_cast<int64_t>(t.sampled.token.size());
    }
    if (first_[index] || !c.text.empty() || !c.token_logprobs.empty() || c.finish != pb::FINISH_REASON_UNSPECIFIED) {
      out.push_back(OpenAiChunkEvent(endpoint_, id_, created_, model_, c, usage_));
    }
    first_[index] = false;
    if (r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
      total_.set_prompt_tokens(r.usage().prompt_tokens());
      total_.set_cached_tokens(std::max(total_.cached_tokens(), r.usage().cached_tokens()));
      total_.set_completion_tokens(total_.completion_tokens() + r.usage().completion_tokens());
      if (++finished_ == shape_.n && usage_) {
        out.push_back(OpenAiUsageChunkEvent(endpoint_, id_, created_, model_, total_));
      }
    }
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait(lock, [&] { return s_->events.size() < HttpServer::kMaxQueuedEvents || s_->ctx.cancelled(); });
    if (s_->ctx.cancelled()) return false;
    for (auto& e : out) s_->events.push_back(std::move(e));
    s_->started = true;
    s_->cv.notify_all();
    return true;
  }

 private:
  Stream* const s_;
  const OpenAiEndpoint endpoint_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const bool usage_;
  const ChoiceShape shape_;
  std::vector<bool> first_;        // per choice: no chunk sent yet
  std::vector<int64_t> offsets_;   // per choice: completions' text_offset so far
  int finished_ = 0;
  pb::Usage total_;
};

// Collects a non-streamed response, per choice.
class CollectSink final : public ResponseSink {
 public:
  explicit CollectSink(ChoiceShape shape) : shape_(shape), choices(shape.n) {
    for (int i = 0; i < shape.n; ++i) {
      choices[i].index = i;
      choices[i].logprobs = shape.logprobs;
    }
  }
  bool Write(const pb::GenerateResponse& r) override {
    if (r.index() < 0 || r.index() >= shape_.n) return false;
    OpenAiChoice& c = choices[r.index()];
    c.text += r.text();
    if (shape_.logprobs) {
      auto more = ResolveLogprobs(r, shape_.tokenizer);
      c.token_logprobs.insert(c.token_logprobs.end(), std::make_move_iterator(more.begin()),
                              std::make_move_iterator(more.end()));
    }
    if (r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
      c.finish = r.finish_reason();
      usage.set_prompt_tokens(r.usage().prompt_tokens());
      usage.set_cached_tokens(std::max(usage.cached_tokens(), r.usage().cached_tokens()));
      usage.set_completion_tokens(usage.completion_tokens() + r.usage().completion_tokens());
    }
    return true;
  }
  const ChoiceShape shape_;
  std::vector<OpenAiChoice> choices;
  pb::Usage usage;
};

}  // namespace

struct HttpServer::Impl {
  explicit Impl(std::unique_ptr<httplib::Server> s) : server_owner(std::move(s)), server(*server_owner) {}
  HttpServerOptions options;
  RequestPath* path = nullptr;
  std::function<bool()> healthy;
  std::unique_ptr<httplib::Server> server_owner;  // an httplib::SSLServer with TLS
  httplib::Server& server;
  std::thread thread;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::once_flag shutdown_once;

  void Generate(OpenAiEndpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void Routes();
};

void HttpServer::Impl::Generate(OpenAiEndpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  OpenAiDefaults d;
  d.served_model = options.model_name;
  d.chat_max_tokens = std::min(path->config().limits.max_tokens, std::max(1, path->model_config().max_position - 1));
  // Credentials first: a client without a key learns nothing about the model or its parameters.
  if (Status a = path->Authorize(req.get_header_value("Authorization")); !a.ok()) {
    path->CountRefused(a);
    return SendError(res, ApiErrorFromStatus(a));
  }
  ApiError error;
  auto parsed = ParseOpenAiRequest(endpoint, req.body, d, &error);
  if (!parsed.ok()) {
    path->CountRefused(parsed.status());
    return SendError(res, error);
  }
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  const std::string id = RequestId(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  parsed->request.set_request_id(id);
  ChoiceShape shape;
  shape.n = std::max(1, parsed->request.n());
  shape.logprobs = parsed->request.sampling().logprobs();
  shape.tokenizer = path->tokenizer();

  if (!parsed->stream) {
    CancellableRequestContext ctx(DeadlineFrom(*path), req.get_header_value("Authorization"));
    CollectSink sink(shape);
    Status s = path->Generate(parsed->request, ctx, sink);
    if (!s.ok()) return SendError(res, ApiErrorFromStatus(s));
    res.set_content(OpenAiResponseJson(endpoint, id, created, options.model_name, sink.choices, sink.usage), kJson);
    return;
  }

  auto stream = std::make_shared<Stream>(DeadlineFrom(*path), req.get_header_value("Authorization"));
  Stream* s = stream.get();
  stream->thread = std::thread([this, s, endpoint, id, created, request = std::move(parsed->request),
                                usage = parsed->include_usage, shape] {
    StreamSink sink(s, endpoint, id, created, options.model_name, usage, shape);
    Status st = path->Generate(request, s->ctx, sink);
    std::lock_guard<std::mutex> lock(s->mu);
    s->finished = true;
    s->status = st;
    s->cv.notify_all();
  });
  {
    // Errors before the first token (validation, admission, prefill) keep their HTTP status.
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->started || s->finished; });
    if (!s->started) {
      Status st = s->status;
      lock.unlock();
      return SendError(res, ApiErrorFromStatus(st));
    }
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, stream](size_t /*offset*/, httplib::DataSink& out) -> bool {
        Stream* s = stream.get();
        std::unique_lock<std::mutex> lock(s->mu);
        while (true) {
          if (stopping) {
            lock.unlock();
            s->ctx.Cancel();
            s->cv.notify_all();
            return false;
          }
          if (s->events.empty() && s->finished) break;
          if (s->events.empty()) {
            if (!s->cv.wait_for(lock, kHeartbeat, [&] { return !s->events.empty() || s->finished; })) {
              lock.unlock();
              const bool ok = out.write(": keep-alive\n\n", 14);
              lock.lock();
              if (!ok) break;
            }
            continue;
          }
          std::deque<std::string> batch;
          batch.swap(s->events);
          s->cv.notify_all();  // room in the queue again
          lock.unlock();
          bool ok = true;
          for (const auto& e : batch) {
            if (!(ok = out.write(e.data(), e.size()))) break;
          }
          lock.lock();
          if (!ok) {
            lock.unlock();
            s->ctx.Cancel();  // the client went away: stop the generation on the workers
            s->cv.notify_all();
            return false;
          }
        }
        if (!s->finished) {  // a heartbeat could not be written
          lock.unlock();
          s->ctx.Cancel();
          s->cv.notify_all();
          return false;
        }
        std::string tail;
        if (!s->status.ok()) {
          // The stream had begun: the error comes as an event in OpenAI's error shape.
          tail = "data: " + ApiErrorJson(ApiErrorFromStatus(s->status)) + "\n\n";
        }
        lock.unlock();
        tail += "data: [DONE]\n\n";
        out.write(tail.data(), tail.size());
        out.done();
        return true;
      },
      [stream](bool /*success*/) { stream->ctx.Cancel(); });
}

void HttpServer::Impl::Routes() {
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(OpenAiEndpoint::kCompletions, req, res);
  });
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(OpenAiEndpoint::kChatCompletions, req, res);
  });
  server.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (Status a = path->Authorize(req.get_header_value("Authorization")); !a.ok()) {
      return SendError(res, ApiErrorFromStatus(a));
    }
    res.set_content(OpenAiModelsJson(options.model_name, static_cast<int64_t>(std::time(nullptr))), kJson);
  });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = healthy();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "{\"status\":\"serving\"}" : "{\"status\":\"not serving\"}", kJson);
  });
  // Known paths with the wrong method: 405 with Allow.
  auto not_allowed = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      ApiError e;
      e.http_status = 405;
      e.type = "invalid_request_error";
      e.message = req.method + " is not allowed on " + req.path + " (use " + allow + ")";
      res.set_header("Allow", allow);
      SendError(res, e);
    };
  };
  for (const char* p : {"/v1/completions", "/v1/chat/completions"}) {
    server.Get(p, not_allowed("POST"));
    server.Put(p, not_allowed("POST"));
    server.Delete(p, not_allowed("POST"));
    server.Patch(p, not_allowed("POST"));
  }
  for (const char* p : {"/v1/models", "/health"}) {
    server.Post(p, not_allowed("GET"));
    server.Put(p, not_allowed("GET"));
    server.Delete(p, not_allowed("GET"));
    server.Patch(p, not_allowed("GET"));
  }
  // Errors httplib produces itself (no route, body too large, malformed request) get a body in
  // OpenAI's shape too.
  server.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.http_status = res.status;
    e.type = "invalid_request_error";
    if (res.status == 404) {
      e.message = "no such path: " + req.method + " " + req.path +
                  " (paths: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health)";
    } else if (res.status == 413) {
      e.message = "the request body is larger than " + std::to_string(options.max_body_bytes) +
                  " bytes (limits.max_message_bytes)";
    } else if (res.status >= 500) {
      e.type = "internal_error";
      e.message = "internal error";
    } else {
      e.message = "bad request (HTTP " + std::to_string(res.status) + ")";
    }
    SendError(res, e);
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.http_status = 500;
    e.type = "internal_error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& x) {
      e.message = std::string("internal error: ") + x.what();
    } catch (...) {
      e.message = "internal error";
    }
    SendError(res, e);
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, RequestPath* path,
                                                        std::function<bool()> healthy) {
  std::unique_ptr<httplib::Server> server;
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return InvalidArgumentError("HTTP: router.tls_cert_file and router.tls_key_file go together");
  }
  if (!options.tls_cert_file.empty()) {
    for (const auto& [key, file] : {std::pair{"router.tls_cert_file", options.tls_cert_file},
                                    std::pair{"router.tls_key_file", options.tls_key_file}}) {
      if (::access(file.c_str(), R_OK) != 0) return InvalidArgumentError(std::string(key) + ": cannot read '" + file + "'");
    }
    auto ssl = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(), options.tls_key_file.c_str());
    if (!ssl->is_valid()) {
      return InvalidArgumentError("router.tls_cert_file / router.tls_key_file: '" + options.tls_cert_file + "' and '" +
                                  options.tls_key_file + "' are not a PEM certificate chain and its private key");
    }
    server = std::move(ssl);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  auto impl = std::make_unique<Impl>(std::move(server));
  impl->options = options;
  impl->path = path;
  impl->healthy = std::move(healthy);
  const int threads = std::max(1, options.threads);
  impl->server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  impl->server.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  impl->server.set_keep_alive_max_count(1000);
  impl->server.set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, options.idle_keepalive_seconds)));
  impl->server.set_read_timeout(30, 0);
  impl->server.set_write_timeout(static_cast<time_t>(std::max(1.0, options.write_timeout_seconds)), 0);
  impl->Routes();
  // httplib 0.11 listens with a backlog of 5, which refuses connections when many clients
  // connect at once (64 streams in the test): remember the listening socket and listen again
  // with the system's maximum after binding. SO_REUSEADDR as httplib's default options set it.
  int listen_fd = -1;
  impl->server.set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  if (options.port == 0) {
    impl->port = impl->server.bind_to_any_port(options.host);
    if (impl->port <= 0) return UnavailableError("HTTP: cannot bind a port on " + options.host);
  } else {
    if (!impl->server.bind_to_port(options.host, options.port)) {
      return UnavailableError("HTTP: cannot bind " + options.host + ":" + std::to_string(options.port) +
                              " (router.http_port; in use?)");
    }
    impl->port = options.port;
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  // httplib's stop() does nothing before the loop runs: wait for it so that Shutdown never hangs.
  while (!impl->server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { Shutdown(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::Shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    impl_->stopping = true;
    impl_->server.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  });
}

}  // namespace icecache::router
