// The icecache make-model / logits / generate commands, run as a user runs them.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/test_util.h"

namespace icecache::model {
namespace {

using testing::FixtureDir;
using testing::ReadFile;
using testing::TempDir;

struct Result {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `env`: VAR=VALUE words put before the command.
Result RunCli(const std::string& args, const std::string& env = "") {
  TempDir tmp;
  const std::string err_file = tmp.path() + "/stderr";
  const std::string cmd = env + " " + std::string(ICECACHE_BINARY_DIR) + "/bin/icecache " + args + " 2>" + err_file;
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadFile(err_file);
  return r;
}

TEST(Cli, LogitsMatchesReference) {
  auto expected = nlohmann::json::parse(ReadFile(FixtureDir("qwen3_qknorm_headdim32_f32") + "/expected_logits.json"));
  std::string ids;
  for (int id : expected["ids"]) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id);
  }
  Result r = RunCli("logits --model " + FixtureDir("qwen3_qknorm_headdim32_f32") + " --ids " + ids);
  ASSERT_EQ(r.code, 0) << r.err;
  auto got = nlohmann::json::parse(r.out)["logits"];
  ASSERT_EQ(got.size(), expected["logits"].size());
  for (size_t row = 0; row < got.size(); ++row) {
    double maxref = 0, maxdiff = 0;
    for (size_t v = 0; v < got[row].size(); ++v) {
      const double want = expected["logits"][row][v].get<double>();
      maxref = std::max(maxref, std::fabs(want));
      maxdiff = std::max(maxdiff, std::fabs(got[row][v].get<double>() - want));
    }
    EXPECT_LT(maxdiff / maxref, 1e-3) << "row " << row;  // same tolerance as the library test
  }
}

// ICECACHE_MATMUL_PRECISION (kernels/matmul.h) read at start: each value logs its choice, bf16
// moves a bf16 model's prefill logits by bf16 rounding only, an unknown value is a warning that
// names the accepted ones (and the default, auto, runs).
TEST(Cli, MatmulPrecisionFromTheEnvironment) {
  TempDir dir;
  Result mk = RunCli("make-model --out " + dir.path() + " --arch llama --hidden 64 --layers 2 --heads 4 --kv-heads 2 "
                     "--vocab 300 --dtype bf16 --seed 3 --no-tokenizer");
  ASSERT_EQ(mk.code, 0) << mk.err;
  std::string ids;
  for (int i = 0; i < 24; ++i) {  // 24 rows: the GEMM path (m > 16)
    if (!ids.empty()) ids += ',';
    ids += std::to_string(7 * i + 1);
  }
  auto run = [&](const std::string& value) {
    return RunCli("logits --model " + dir.path() + " --ids " + ids, "ICECACHE_MATMUL_PRECISION=" + value);
  };
  const Result fp32 = run("fp32"), bf16 = run("bf16"), bad = run("fp16");
  ASSERT_EQ(fp32.code, 0) << fp32.err;
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  EXPECT_NE(fp32.err.find("fp32 activations (matmul precision fp32"), std::string::npos) << fp32.err;
  EXPECT_NE(bf16.err.find("bf16 activations (matmul precision bf16"), std::string::npos) << bf16.err;
  EXPECT_EQ(bad.code, 0) << bad.err;
  EXPECT_NE(bad.err.find("ignoring ICECACHE_MATMUL_PRECISION"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("must be auto, fp32, bf16 or int8, got 'fp16'"), std::string::npos) << bad.err;
  const auto a = nlohmann::json::parse(fp32.out)["logits"], b = nlohmann::json::parse(bf16.out)["logits"];
  ASSERT_EQ(a.size(), 24u);
  ASSERT_EQ(b.size(), a.size());
  double maxref = 0, maxdiff = 0;
  for (size_t row = 0; row < a.size(); ++row) {
    for (size_t v = 0; v < a[row].size(); ++v) {
      maxref = std::max(maxref, std::fabs(a[row][v].get<double>()));
      maxdiff = std::max(maxdiff, std::fabs(a[row][v].get<double>() - b[row][v].get<double>()));
    }
  }
  EXPECT_GT(maxdiff, 0.0);              // the rounding happened
  EXPECT_LT(maxdiff / maxref, 3e-2);  // and is bf16-sized (reference_logits_test's tolerance)
}

TEST(Cli, MakeModelThenGenerateIds) {
  TempDir dir;
  Result mk = RunCli("make-model --out " + dir.path() + " --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 "
                     "--head-dim 24 --vocab 300 --dtype f32 --seed 9 --no-tokenizer");
  ASSERT_EQ(mk.code, 0) << mk.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/tokenizer.json"));
  auto m = Model::Load(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().head_dim, 24);
  EXPECT_TRUE((*m)->config().qk_norm);

  Result gen = RunCli("generate --model " + dir.path() + " --prompt-ids 5,6,7 --max-tokens 6 --ignore-eos --output ids");
  ASSERT_EQ(gen.code, 0) << gen.err;
  // The same greedy generation through the library.
  DenseKvCache cache((*m)->attention_shape());
  Generator g(**m, cache);
  SamplingParams p;
  p.max_tokens = 6;
  p.ignore_eos = true;
  ASSERT_TRUE(g.Add({5, 6, 7}, p).ok());
  std::string want;
  while (!g.idle()) {
    std::vector<GenerationEvent> ev;
    ASSERT_TRUE(g.Step(&ev).ok());
    for (auto& e : ev) {
      if (!want.empty()) want += ',';
      want += std::to_string(e.token);
    }
  }
  EXPECT_EQ(gen.out, want + "\n");

  Result text = RunCli("generate --model " + dir.path() + " --prompt hello");
  EXPECT_EQ(text.code, 1);
  EXPECT_NE(text.err.find("has no tokenizer.json"), std::string::npos) << text.err;
}

TEST(Cli, GenerateTextWithTokenizer) {
  TempDir dir;
  Result mk = RunCli("make-model --out " + dir.path() + " --arch llama --hidden 64 --layers 2 --vocab 400 --seed 2");
  ASSERT_EQ(mk.code, 0) << mk.err;
  Result gen = RunCli("generate --model " + dir.path() + " --prompt 'The cache' --max-tokens 8 --temperature 0.9 "
                      "--top-p 0.9 --top-k 50 --seed 4 --ignore-eos");
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_NE(gen.err.find("8 generated, finish: length"), std::string::npos) << gen.err;
  Result again = RunCli("generate --model " + dir.path() + " --prompt 'The cache' --max-tokens 8 --temperature 0.9 "
                        "--top-p 0.9 --top-k 50 --seed 4 --ignore-eos");
  EXPECT_EQ(gen.out, again.out);  // seeded
}

// --chat with a real tokenizer (the Qwen3 tokenizer fixture, ChatML template) on a random
// checkpoint of Qwen3's vocabulary size.
TEST(Cli, GenerateChatWithQwen3Tokenizer) {
  TempDir dir;
  Result mk = RunCli("make-model --out " + dir.path() + " --arch qwen3 --hidden 32 --layers 1 --heads 2 --kv-heads 1 "
                     "--head-dim 16 --vocab 151936 --no-tokenizer");
  ASSERT_EQ(mk.code, 0) << mk.err;
  const std::string tok = std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3/";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tok + f, dir.path() + "/" + f);
  }
  auto m = Model::Load(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto text = (*m)->tokenizer()->ApplyChatTemplate({{"user", "Hello there"}}, true);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto ids = (*m)->tokenizer()->Encode(*text, false);
  ASSERT_TRUE(ids.ok());
  Result gen = RunCli("generate --model " + dir.path() + " --chat --prompt 'Hello there' --max-tokens 4 --ignore-eos");
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_NE(gen.err.find("[" + std::to_string(ids->size()) + " prompt tokens, 4 generated"), std::string::npos)
      << gen.err;
}

// --tensor-parallel N: CPU ranks as threads give the single-rank greedy ids (fixture with 8 q
// heads and 4 kv heads: TP = 2 splits them); a count that does not divide is refused.
TEST(Cli, GenerateTensorParallel) {
  const std::string base = "generate --model " + FixtureDir("qwen3_qknorm_tied_bf16") +
                           " --device cpu --prompt-ids 3,1,4,1,5,9,2,6 --max-tokens 32 --ignore-eos --output ids";
  Result one = RunCli(base);
  ASSERT_EQ(one.code, 0) << one.err;
  Result two = RunCli(base + " --tensor-parallel 2");
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_EQ(two.out, one.out);
  EXPECT_NE(two.err.find("32 generated"), std::string::npos) << two.err;
  Result three = RunCli(base + " --tensor-parallel 3");
  EXPECT_EQ(three.code, 1);
  EXPECT_NE(three.err.find("tensor_parallel_size 3 does not divide num_attention_heads 8"), std::string::npos)
      << three.err;
  EXPECT_EQ(RunCli(base + " --tensor-parallel 0").code, 2);
}

TEST(Cli, UsageAndInputErrors) {
  EXPECT_EQ(RunCli("generate --model x --prompt-ids 1 --bogus").code, 2);
  EXPECT_EQ(RunCli("generate --model x --prompt a --prompt-ids 1").code, 2);
  EXPECT_EQ(RunCli("generate --model x --prompt-ids 1,a").code, 2);
  EXPECT_EQ(RunCli("generate --model x --prompt-ids 1 --top-p 0").code, 2);
  EXPECT_EQ(RunCli("logits --model x").code, 2);
  EXPECT_EQ(RunCli("make-model --out /tmp/x --arch gpt2").code, 2);
  Result missing = RunCli("logits --model /nonexistent/dir --ids 1");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/dir/config.json"), std::string::npos) << missing.err;
  Result range = RunCli("logits --model " + FixtureDir("llama_gqa_f32") + " --ids 1,300");
  EXPECT_EQ(range.code, 1);
  EXPECT_NE(range.err.find("token id 300"), std::string::npos) << range.err;
}

}  // namespace
}  // namespace icecache::model
