// icecache generate: run a model directory locally and stream the generated text (or ids).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "model/tokenizer/tokenizer.h"
#include "tools/cli/command.h"
#ifdef ICECACHE_HAVE_CLUSTER
#include "client/client.h"
#endif
#include "tools/cli/generate_options.h"

namespace icecache::cli {
namespace {

int Fail(const Status& st) {
  std::fprintf(stderr, "icecache generate: %s\n", st.ToString().c_str());
  return 1;
}

int RunGenerate(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kGenerateUsage, stdout);
      return 0;
    }
  }
  auto opts = ParseGenerateOptions(argc, argv);
  if (!opts.ok()) {
    std::fprintf(stderr, "icecache generate: %s\n%s", opts.status().message().c_str(), kGenerateUsage);
    return 2;
  }
  GenerateOptions& o = *opts;
  if (!o.router.empty()) {
#ifdef ICECACHE_HAVE_CLUSTER
    // Remote mode: the cluster tokenizes (bos added where the tokenizer asks, or the chat
    // template with --chat) and samples.
    if (!o.add_bos || o.sampling.repetition_penalty != 1.f) {
      std::fprintf(stderr, "icecache generate: --no-bos and --repetition-penalty are local-only options\n");
      return 2;
    }

    router::RemoteGenerateOptions r;
    r.router = o.router;
    r.prompt = o.prompt;
    r.prompt_ids = o.prompt_ids;
    r.max_tokens = o.sampling.max_tokens;
    r.temperature = o.sampling.temperature;
    r.top_p = o.sampling.top_p;
    r.top_k = o.sampling.top_k;
    r.seed = o.sampling.seed.value_or(0);
    r.presence_penalty = o.sampling.presence_penalty;
    r.frequency_penalty = o.sampling.frequency_penalty;
    r.stop = o.sampling.stop_strings;
    r.stop_ids = o.sampling.stop_ids;
    r.ignore_eos = o.sampling.ignore_eos;
    r.budget_pages = o.budget_pages;
    r.chat = o.chat;
    r.api_key = o.api_key;
    r.tls_ca_file = o.tls_ca;
    if (r.api_key.empty()) {
      if (const char* k = std::getenv("ICECACHE_API_KEY"); k != nullptr) r.api_key = k;
    }  // the router formats the message with the model's chat template
    return router::PrintRemoteGeneration(r, o.output == GenerateOptions::Output::kIds);
#else
    std::fprintf(stderr, "icecache generate: --router is not available in this build (run with --model)\n");
    return 2;
#endif
  }
  if (o.threads > 0) kernels::SetCpuThreads(o.threads);
  // One Model, or a tensor-parallel group of rank Models (model/tensor_parallel.h).
  std::unique_ptr<model::Model> single;
  std::unique_ptr<model::TpGroup> group;
  if (o.tensor_parallel > 1) {
    model::TpGroupOptions to;
    to.size = o.tensor_parallel;
    to.device = o.device;
    auto loaded = model::TpGroup::Load(o.model_dir, to);
    if (!loaded.ok()) return Fail(loaded.status());
    group = std::move(*loaded);
  } else {
    model::ModelLoadOptions lo;
    lo.device = o.device;
    lo.gguf_weights = o.gguf_weights;
    auto loaded = model::Model::Load(o.model_dir, lo);
    if (!loaded.ok()) return Fail(loaded.status());
    single = std::move(*loaded);
  }
  model::LanguageModel& m = group ? static_cast<model::LanguageModel&>(*group) : *single;
  const tokenizer::Tokenizer* tok = m.tokenizer();
  const bool want_text = o.output == GenerateOptions::Output::kText ||
                         (o.output == GenerateOptions::Output::kDefault && tok != nullptr);
  if (tok == nullptr && (o.prompt.has_value() || want_text || !o.sampling.stop_strings.empty())) {
    return Fail(FailedPreconditionError(o.model_dir + " has no tokenizer.json, so it serves token ids only: use " +
                                        "--prompt-ids 1,2,3 and --output ids (and --stop-id instead of --stop)"));
  }
  std::vector<int32_t> prompt = o.prompt_ids;
  if (o.prompt.has_value()) {
    std::string text = *o.prompt;
    bool add_special = o.add_bos;
    if (o.chat) {
      auto formatted = tok->ApplyChatTemplate({{"user", text}}, /*add_generation_prompt=*/true);
      if (!formatted.ok()) return Fail(formatted.status());
      text = std::move(*formatted);
      add_special = false;  // the template writes its own bos token
    }
    auto ids = tok->Encode(text, add_special);
    if (!ids.ok()) return Fail(ids.status());
    prompt = std::move(*ids);
  }
  model::DenseKvCacheOptions kv;
  kv.page_size = o.kv_page_size;
  kv.device = m.device();
  std::unique_ptr<model::AttentionBackend> cache;
  if (group) {
    cache = group->NewDenseKvCache(kv);
  } else {
    cache = std::make_unique<model::DenseKvCache>(single->attention_shape(), kv);
  }
  model::Generator gen(m, *cache, tok, {});
  auto id = gen.Add(prompt, o.sampling);
  if (!id.ok()) return Fail(id.status());
  std::vector<int32_t> out;
  model::FinishReason finish = model::FinishReason::kNone;
  while (!gen.idle()) {
    std::vector<model::GenerationEvent> events;
    Status st = gen.Step(&events);
    if (!st.ok()) return Fail(st);
    for (const auto& e : events) {
      out.push_back(e.token);
      if (want_text && !e.text_delta.empty()) {
        std::fwrite(e.text_delta.data(), 1, e.text_delta.size(), stdout);
        std::fflush(stdout);
      }
      if (e.finish != model::FinishReason::kNone) finish = e.finish;
    }
  }
  if (want_text) {
    std::fputc('\n', stdout);
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf(i ? ",%d" : "%d", out[i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "[%zu prompt tokens, %zu generated, finish: %s]\n", prompt.size(), out.size(),
               std::string(model::FinishReasonName(finish)).c_str());
  return 0;
}

}  // namespace

ICE_CLI_COMMAND("generate", "generate text or token ids from a model directory", RunGenerate);

}  // namespace icecache::cli
