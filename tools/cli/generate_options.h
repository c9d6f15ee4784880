// Options of `icecache generate`, parsed into a struct so that other front ends (a remote
// `--router HOST:PORT` mode, tests) share one parser. Header-only: the CLI build compiles only
// *_command.cc files.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/kv_pages.h"
#include "model/model.h"
#include "model/sampler.h"

namespace icecache::cli {

inline constexpr const char* kGenerateUsage =
    "usage: icecache generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
    "  --max-tokens N          tokens to generate (default 64)\n"
    "  --temperature T         0 = greedy (default 0)\n"
    "  --top-p P               nucleus sampling mass in (0, 1] (default 1)\n"
    "  --top-k K               keep the K most likely tokens (0 = all; default 0)\n"
    "  --seed S                seed for reproducible sampling\n"
    "  --repetition-penalty R  (default 1 = off)\n"
    "  --presence-penalty P    OpenAI's presence penalty over generated tokens, [-2, 2] (default 0)\n"
    "  --frequency-penalty F   OpenAI's frequency penalty over generated tokens, [-2, 2] (default 0)\n"
    "  --stop STR              stop when the text contains STR (repeatable)\n"
    "  --stop-id ID            stop after token ID (repeatable; eos ids always stop)\n"
    "  --ignore-eos            do not stop at the model's eos ids\n"
    "  --no-bos                do not prepend the bos token to a text prompt\n"
    "  --chat                  wrap --prompt as one user message in the model's chat template\n"
    "  --output text|ids       stream text (default when the model has a tokenizer) or print ids\n"
    "  --kv-page-size N        tokens per KV page (default 16)\n"
    "  --threads N             CPU threads for the kernels (default: all)\n"
    "  --device D              auto (a GPU when present; default), cpu, cuda or cuda:N\n"
    "  --gguf-weights W        keep (default: a GGUF's Q8_0/Q4_0/Q4_1 weights stay quantised on the CPU)\n"
    "                          or bf16 (dequantised at load)\n"
    "  --tensor-parallel N     split the model over N ranks (threads of this process: CPU ranks, or\n"
    "                          one GPU each from --device's index on; default 1)\n"
    "  --router HOST:PORT      generate on an icecache cluster instead of locally (no --model)\n"
    "  --budget full|PAGES     remote: KV page budget of sparse layers (default: the cluster's)\n"
    "  --api-key KEY           remote: the router's API key (default: $ICECACHE_API_KEY)\n"
    "  --tls-ca FILE           remote: the router's port is TLS (router.tls_cert_file); verify it against this PEM CA\n";

struct GenerateOptions {
  std::string model_dir;
  std::optional<std::string> prompt;
  std::vector<int32_t> prompt_ids;
  model::SamplingParams sampling;
  enum class Output { kDefault, kText, kIds } output = Output::kDefault;
  bool add_bos = true;
  bool chat = false;
  int kv_page_size = kernels::kDefaultPageSize;
  int threads = 0;
  kernels::Device device;  // where the model runs (auto: a GPU when present)
  model::GgufWeights gguf_weights = model::GgufWeights::kKeep;
  int tensor_parallel = 1;  // ranks of a model::TpGroup (1 = one Model)
  std::string router;  // remote mode (HOST:PORT of an icecache router); empty = run the model locally
  int budget_pages = -1;  // remote mode: -1 = the cluster's default, 0 = full attention, else pages
  std::string api_key;    // remote mode: sent as "authorization: Bearer KEY"; empty = none
  std::string tls_ca;     // remote mode: TLS to the router, verified against this CA file; empty = plaintext
};

// Parses "1,2,3" (no spaces required; empty items refused).
inline StatusOr<std::vector<int32_t>> ParseIdList(std::string_view text, std::string_view flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string item(text.substr(pos, comma - pos));
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    char* end = nullptr;
    errno = 0;
    long long v = item.empty() ? 0 : std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
      return InvalidArgumentError(std::string(flag) + ": '" + item + "' is not a token id (want e.g. 1,2,3)");
    }
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

namespace internal {
inline StatusOr<double> ParseNumber(const char* flag, const char* value) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value, &end);
  if (end == value || *end != '\0' || errno != 0) {
    return InvalidArgumentError(std::string(flag) + ": '" + value + "' is not a number");
  }
  return v;
}
inline StatusOr<int64_t> ParseInteger(const char* flag, const char* value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || errno != 0 || v < lo || v > hi) {
    return InvalidArgumentError(std::string(flag) + ": '" + value + "' must be an integer in [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "]");
  }
  return static_cast<int64_t>(v);
}
}  // namespace internal

// argv[0] is the subcommand name. INVALID_ARGUMENT (a usage error) on unknown or malformed flags.
inline StatusOr<GenerateOptions> ParseGenerateOptions(int argc, char** argv) {
  GenerateOptions o;
  o.sampling.max_tokens = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> StatusOr<const char*> {
      if (i + 1 >= argc) return InvalidArgumentError(flag + " needs a value");
      return static_cast<const char*>(argv[++i]);
    };
    if (flag == "--model") {
      ICE_ASSIGN_OR_RETURN(o.model_dir, value());
    } else if (flag == "--prompt") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      o.prompt = v;
    } else if (flag == "--prompt-ids") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(o.prompt_ids, ParseIdList(v, flag));
    } else if (flag == "--max-tokens") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t n, internal::ParseInteger("--max-tokens", v, 1, 1 << 24));
      o.sampling.max_tokens = static_cast<int>(n);
    } else if (flag == "--temperature") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(double t, internal::ParseNumber("--temperature", v));
      o.sampling.temperature = static_cast<float>(t);
    } else if (flag == "--top-p") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(double t, internal::ParseNumber("--top-p", v));
      o.sampling.top_p = static_cast<float>(t);
    } else if (flag == "--top-k") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t k, internal::ParseInteger("--top-k", v, 0, INT32_MAX));
      o.sampling.top_k = static_cast<int>(k);
    } else if (flag == "--seed") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t s, internal::ParseInteger("--seed", v, 0, INT64_MAX));
      o.sampling.seed = static_cast<uint64_t>(s);
    } else if (flag == "--repetition-penalty") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(double r, internal::ParseNumber("--repetition-penalty", v));
      o.sampling.repetition_penalty = static_cast<float>(r);
    } else if (flag == "--presence-penalty" || flag == "--frequency-penalty") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(double x, internal::ParseNumber(flag.c_str(), v));
      if (!(x >= -2 && x <= 2)) return InvalidArgumentError(std::string(flag) + " must be in [-2, 2]");
      (flag == "--presence-penalty" ? o.sampling.presence_penalty : o.sampling.frequency_penalty) = static_cast<float>(x);
    } else if (flag == "--stop") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      o.sampling.stop_strings.push_back(v);
    } else if (flag == "--stop-id") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t id, internal::ParseInteger("--stop-id", v, 0, INT32_MAX));
      o.sampling.stop_ids.push_back(static_cast<int32_t>(id));
    } else if (flag == "--ignore-eos") {
      o.sampling.ignore_eos = true;
    } else if (flag == "--no-bos") {
      o.add_bos = false;
    } else if (flag == "--chat") {
      o.chat = true;
    } else if (flag == "--output") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      const std::string out = v;
      if (out == "text") o.output = GenerateOptions::Output::kText;
      else if (out == "ids") o.output = GenerateOptions::Output::kIds;
      else return InvalidArgumentError("--output must be text or ids, not '" + out + "'");
    } else if (flag == "--kv-page-size") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t n, internal::ParseInteger("--kv-page-size", v, 1, 4096));
      o.kv_page_size = static_cast<int>(n);
    } else if (flag == "--threads") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t n, internal::ParseInteger("--threads", v, 0, 4096));
      o.threads = static_cast<int>(n);
    } else if (flag == "--device") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(o.device, kernels::ParseDevice(v));
    } else if (flag == "--gguf-weights") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(o.gguf_weights, model::ParseGgufWeights(v));
    } else if (flag == "--tensor-parallel") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      ICE_ASSIGN_OR_RETURN(int64_t n, internal::ParseInteger("--tensor-parallel", v, 1, 1024));
      o.tensor_parallel = static_cast<int>(n);
    } else if (flag == "--router") {
      ICE_ASSIGN_OR_RETURN(o.router, value());
    } else if (flag == "--api-key") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      o.api_key = v;
    } else if (flag == "--tls-ca") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      o.tls_ca = v;
    } else if (flag == "--budget") {
      ICE_ASSIGN_OR_RETURN(const char* v, value());
      if (std::string(v) == "full") {
        o.budget_pages = 0;
      } else {
        ICE_ASSIGN_OR_RETURN(int64_t n, internal::ParseInteger("--budget", v, 1, INT32_MAX));
        o.budget_pages = static_cast<int>(n);
      }
    } else {
      return InvalidArgumentError("unknown option '" + flag + "'");
    }
  }
  if (o.model_dir.empty() && o.router.empty()) return InvalidArgumentError("--model DIR is required");
  if (o.prompt.has_value() == !o.prompt_ids.empty()) {
    return InvalidArgumentError("give exactly one of --prompt TEXT and --prompt-ids 1,2,3");
  }
  if (o.chat && !o.prompt.has_value()) return InvalidArgumentError("--chat needs --prompt TEXT");
  ICE_RETURN_IF_ERROR(model::ValidateSamplingParams(o.sampling));
  return o;
}

}  // namespace icecache::cli
