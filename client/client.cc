#include "client/client.h"

#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "icecache/v1/generation.grpc.pb.h"
#include "serving/grpc_util.h"

namespace icecache::router {

namespace pb = ::icecache::v1;

Status RunRemoteGenerate(const RemoteGenerateOptions& o, const std::function<bool(const RemoteChunk&)>& on_chunk) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  if (!o.tls_ca_file.empty()) {
    std::ifstream f(o.tls_ca_file, std::ios::binary);
    std::stringstream ca;
    ca << f.rdbuf();
    if (!f || ca.str().find("-----BEGIN ") == std::string::npos) {
      return InvalidArgumentError("--tls-ca: '" + o.tls_ca_file + "' is not a readable PEM CA certificate");
    }
    grpc::SslCredentialsOptions so;
    so.pem_root_certs = ca.str();
    credentials = grpc::SslCredentials(so);
  }
  auto stub = pb::Generation::NewStub(cluster::MakeChannel(o.router, cluster::kDefaultMaxMessageBytes, credentials));
  pb::GenerateRequest req;
  if (o.prompt) {
    if (o.chat) {
      auto* m = req.mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(*o.prompt);
    } else {
      req.set_text(*o.prompt);
    }
  } else {
    req.mutable_token_ids()->mutable_ids()->Add(o.prompt_ids.begin(), o.prompt_ids.end());
  }
  req.set_max_tokens(o.max_tokens);
  req.mutable_sampling()->set_temperature(o.temperature);
  req.mutable_sampling()->set_presence_penalty(o.presence_penalty);
  req.mutable_sampling()->set_frequency_penalty(o.frequency_penalty);
  req.mutable_sampling()->set_top_p(o.top_p);
  req.mutable_sampling()->set_top_k(o.top_k);
  req.mutable_sampling()->set_seed(o.seed);
  for (const auto& s : o.stop) req.add_stop(s);
  req.mutable_stop_token_ids()->Add(o.stop_ids.begin(), o.stop_ids.end());
  req.set_ignore_eos(o.ignore_eos);
  if (!o.cache_salt.empty()) req.set_cache_salt(o.cache_salt);
  if (o.budget_pages == 0) {
    req.mutable_cache()->set_full(true);
  } else if (o.budget_pages > 0) {
    req.mutable_cache()->set_budget_pages(o.budget_pages);
  }
  grpc::ClientContext ctx;
  if (!o.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o.api_key);
  if (o.timeout_seconds > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         std::chrono::duration<double>(o.timeout_seconds)));
  }
  auto reader = stub->Generate(&ctx, req);
  pb::GenerateResponse r;
  while (reader->Read(&r)) {
    RemoteChunk c;
    c.text = r.text();
    c.token_ids.assign(r.token_ids().begin(), r.token_ids().end());
    c.decode_worker = r.decode_worker();
    if (r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
      c.last = true;
      switch (r.finish_reason()) {
        case pb::FINISH_REASON_LENGTH: c.finish_reason = "length"; break;
        case pb::FINISH_REASON_EOS: c.finish_reason = "eos"; break;
        case pb::FINISH_REASON_STOP: c.finish_reason = "stop"; break;
        default: break;
      }
      c.prompt_tokens = r.usage().prompt_tokens();
      c.completion_tokens = r.usage().completion_tokens();
      c.cached_tokens = r.usage().cached_tokens();
      c.ttft_seconds = r.timing().ttft_seconds();
      c.tpot_seconds = r.timing().tpot_seconds();
      c.e2e_seconds = r.timing().e2e_seconds();
      c.prefill_compute_seconds = r.timing().prefill_compute_seconds();
      c.tree_build_seconds = r.timing().tree_build_seconds();
      c.transfer_seconds = r.timing().transfer_seconds();
      c.pages_fetched = r.timing().pages_fetched();
      c.transfer_bytes = r.timing().transfer_bytes();
    }
    if (!on_chunk(c)) {
      ctx.TryCancel();
      break;
    }
  }
  return cluster::FromGrpc(reader->Finish());
}

}  // namespace icecache::router

namespace icecache::router {

int PrintRemoteGeneration(const RemoteGenerateOptions& options, bool print_ids) {
  std::vector<int32_t> ids;
  RemoteChunk last;
  std::string worker;
  Status s = RunRemoteGenerate(options, [&](const RemoteChunk& c) {
    if (!c.decode_worker.empty()) worker = c.decode_worker;
    ids.insert(ids.end(), c.token_ids.begin(), c.token_ids.end());
    if (!print_ids && !c.text.empty()) {
      std::fwrite(c.text.data(), 1, c.text.size(), stdout);
      std::fflush(stdout);
    }
    if (c.last) last = c;
    return true;
  });
  if (!s.ok()) {
    std::fprintf(stderr, "\nicecache generate: %s\n", s.ToString().c_str());
    return 1;
  }
  if (print_ids) {
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? ",%d" : "%d", ids[i]);
  }
  std::printf("\n");
  std::fprintf(stderr,
               "[%d prompt tokens (%d cached), %d generated, finish: %s; TTFT %.3f s (prefill %.3f, tree %.3f, transfer %.3f), "
               "TPOT %.2f ms, %lld pages fetched; KV %.2f MiB shipped to the decode worker's host store; "
               "decode worker %s]\n",
               last.prompt_tokens, last.cached_tokens, last.completion_tokens, last.finish_reason.c_str(), last.ttft_seconds,
               last.prefill_compute_seconds, last.tree_build_seconds, last.transfer_seconds, last.tpot_seconds * 1e3,
               static_cast<long long>(last.pages_fetched), static_cast<double>(last.transfer_bytes) / (1 << 20),
               worker.c_str());
  return 0;
}

}  // namespace icecache::router
