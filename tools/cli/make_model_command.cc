// icecache make-model: write a random checkpoint in Hugging Face layout.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/dtype.h"
#include "model/random_checkpoint.h"
#include "tools/cli/command.h"

namespace icecache::cli {
namespace {

constexpr const char* kUsage =
    "usage: icecache make-model --out DIR --arch llama|mistral|qwen2|qwen3 [options]\n"
    "  --hidden H (256)  --layers L (4)  --heads N (4)  --kv-heads K (2)  --head-dim D (hidden/heads)\n"
    "  --intermediate I (8/3 hidden)  --vocab V (512, two special tokens included)\n"
    "  --max-position P (4096)  --rope-theta T (10000)  --dtype bf16|f16|f32 (bf16)  --tie  --seed S (0)\n"
    "  --no-tokenizer    write no tokenizer.json (the model then serves token ids only)\n"
    "  --chat-template   add <|im_start|>/<|im_end|> and a ChatML chat_template (serves chat requests)\n"
    "  --check-args      check the options and the model shape, write nothing, exit 0\n";

bool ParseInt(const char* s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int RunMakeModel(int argc, char** argv) {
  std::string out;
  model::RandomModelSpec spec;
  spec.hidden = 256;
  spec.layers = 4;
  bool have_arch = false, check_args = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--tie") {
      spec.tie = true;
      continue;
    }
    if (flag == "--chat-template") {
      spec.chat_template = true;
      continue;
    }
    if (flag == "--check-args") {
      check_args = true;
      continue;
    }
    if (flag == "--no-tokenizer") {
      spec.write_tokenizer = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "icecache make-model: %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const char* v = argv[++i];
    long long n = 0;
    bool ok = true;
    auto as_int = [&](int* field, long long lo) {
      ok = ParseInt(v, lo, 1 << 30, &n);
      if (ok) *field = static_cast<int>(n);
    };
    if (flag == "--out") {
      out = v;
    } else if (flag == "--arch") {
      const std::string a = v;
      have_arch = true;
      if (a == "llama") spec.arch = model::Architecture::kLlama;
      else if (a == "mistral") spec.arch = model::Architecture::kMistral;
      else if (a == "qwen2") spec.arch = model::Architecture::kQwen2;
      else if (a == "qwen3") spec.arch = model::Architecture::kQwen3;
      else ok = false;
    } else if (flag == "--hidden") {
      as_int(&spec.hidden, 2);
    } else if (flag == "--layers") {
      as_int(&spec.layers, 1);
    } else if (flag == "--heads") {
      as_int(&spec.heads, 1);
    } else if (flag == "--kv-heads") {
      as_int(&spec.kv_heads, 1);
    } else if (flag == "--head-dim") {
      as_int(&spec.head_dim, 2);
    } else if (flag == "--intermediate") {
      as_int(&spec.intermediate, 1);
    } else if (flag == "--vocab") {
      as_int(&spec.vocab, 3);
    } else if (flag == "--max-position") {
      as_int(&spec.max_position, 1);
    } else if (flag == "--rope-theta") {
      char* end = nullptr;
      spec.rope_theta = std::strtod(v, &end);
      ok = end != v && *end == '\0' && spec.rope_theta > 1.0;
    } else if (flag == "--dtype") {
      auto d = kernels::ParseDType(v);
      if (d.ok()) spec.dtype = *d;
      else ok = false;
    } else if (flag == "--seed") {
      ok = ParseInt(v, 0, INT64_MAX, &n);
      spec.seed = static_cast<uint64_t>(n);
    } else {
      std::fprintf(stderr, "icecache make-model: unknown option '%s'\n%s", flag.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "icecache make-model: bad value '%s' for %s\n%s", v, flag.c_str(), kUsage);
      return 2;
    }
  }
  if (out.empty() || !have_arch) {
    std::fprintf(stderr, "icecache make-model: --out and --arch are required\n%s", kUsage);
    return 2;
  }
  if (spec.write_tokenizer && spec.vocab < 258) {
    std::fprintf(stderr, "icecache make-model: --vocab must be >= 258 for a byte-level tokenizer (or pass --no-tokenizer)\n");
    return 2;
  }
  if (check_args) {
    auto config = model::RandomModelConfig(spec);
    if (config.ok() && kernels::IsBlockQuantized(spec.dtype)) config = InvalidArgumentError("random checkpoints are f32, f16 or bf16");
    if (!config.ok()) {
      std::fprintf(stderr, "icecache make-model: %s\n", config.status().ToString().c_str());
      return 2;
    }
    std::printf("icecache make-model: options ok (%d layers, hidden %d, %d/%d heads of %d, intermediate %d, vocab %d)\n",
                config->num_layers, config->hidden_size, config->num_heads, config->num_kv_heads, config->head_dim,
                config->intermediate_size, config->vocab_size);
    return 0;
  }
  Status st = model::WriteRandomCheckpoint(out, spec);
  if (!st.ok()) {
    std::fprintf(stderr, "icecache make-model: %s\n", st.ToString().c_str());
    return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

ICE_CLI_COMMAND("make-model", "write a random Llama/Qwen checkpoint in Hugging Face layout", RunMakeModel);

}  // namespace icecache::cli
