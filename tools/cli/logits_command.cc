// icecache logits: the logits of every position of a token-id prompt (one prefill).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model/dense_kv_cache.h"
#include "model/model.h"
#include "tools/cli/command.h"
#include "tools/cli/generate_options.h"

namespace icecache::cli {
namespace {

constexpr const char* kUsage =
    "usage: icecache logits --model DIR --ids 1,2,3\n"
    "  prints {\"logits\": [[...], ...]}: one row of vocab_size floats per input position\n";

int RunLogits(int argc, char** argv) {
  std::string dir;
  std::vector<int32_t> ids;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((flag == "--model" || flag == "--ids") && i + 1 < argc) {
      if (flag == "--model") {
        dir = argv[++i];
      } else {
        auto parsed = ParseIdList(argv[++i], "--ids");
        if (!parsed.ok()) {
          std::fprintf(stderr, "icecache logits: %s\n%s", parsed.status().message().c_str(), kUsage);
          return 2;
        }
        ids = std::move(*parsed);
      }
    } else {
      std::fprintf(stderr, "icecache logits: unknown or incomplete option '%s'\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty() || ids.empty()) {
    std::fprintf(stderr, "icecache logits: --model and --ids are required\n%s", kUsage);
    return 2;
  }
  auto m = model::Model::Load(dir);
  if (!m.ok()) {
    std::fprintf(stderr, "icecache logits: %s\n", m.status().ToString().c_str());
    return 1;
  }
  model::DenseKvCache cache((*m)->attention_shape());
  Status st = cache.AddSequence(0);
  std::vector<float> logits;
  model::SequenceInput in{0, ids};
  if (st.ok()) st = (*m)->Forward({&in, 1}, cache, model::LogitsMode::kAllTokens, &logits);
  if (!st.ok()) {
    std::fprintf(stderr, "icecache logits: %s\n", st.ToString().c_str());
    return 1;
  }
  const size_t vocab = static_cast<size_t>((*m)->config().vocab_size);
  std::string out = "{\"logits\": [";
  char buf[32];
  for (size_t r = 0; r < ids.size(); ++r) {
    out += r ? ", [" : "[";
    for (size_t v = 0; v < vocab; ++v) {
      std::snprintf(buf, sizeof(buf), v ? ", %.9g" : "%.9g", logits[r * vocab + v]);
      out += buf;
    }
    out += "]";
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

ICE_CLI_COMMAND("logits", "print the logits of every position of a token-id prompt (JSON)", RunLogits);

}  // namespace icecache::cli
