// `icecache tokenize` end to end (when the CLI is built), and concurrent use of one Tokenizer.
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

const std::string kQwen3 = testing::SourcePath("tests/fixtures/tokenizers/qwen3/tokenizer.json");

int RunCli(const std::filesystem::path& dir, const std::string& stdin_text, std::string* out, std::string* err) {
  const std::string cli = std::string(ICECACHE_BINARY_DIR) + "/bin/icecache";
  testing::WriteFile(dir / "in.jsonl", stdin_text);
  std::string cmd = cli + " tokenize --tokenizer " + kQwen3 + " < " + (dir / "in.jsonl").string() + " > " +
                    (dir / "out.txt").string() + " 2> " + (dir / "err.txt").string();
  int rc = std::system(cmd.c_str());
  *out = testing::ReadFile((dir / "out.txt").string());
  *err = testing::ReadFile((dir / "err.txt").string());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(CliTest, TokenizeJsonLines) {
  if (!std::filesystem::exists(std::string(ICECACHE_BINARY_DIR) + "/bin/icecache")) {
    GTEST_SKIP() << "the icecache CLI is not built in this build directory";
  }
  auto dir = testing::TestDir();
  std::string out, err;
  EXPECT_EQ(RunCli(dir, "{\"text\": \"Hello, my dog is cute\"}\n\n{\"text\": \"<|im_start|>hi\"}\n", &out, &err), 0)
      << err;
  EXPECT_EQ(out, "{\"ids\":[9707,11,847,5562,374,18838]}\n{\"ids\":[151644,6023]}\n");
  EXPECT_EQ(RunCli(dir, "{\"text\": \"ok\"}\n{\"text\": 5}\n", &out, &err), 1);
  EXPECT_EQ(out, "{\"ids\":[562]}\n");
  EXPECT_NE(err.find("line 2"), std::string::npos) << err;
  EXPECT_EQ(RunCli(dir, "{\"text\": \"ok\"}\n\n{broken\n", &out, &err), 1);
  EXPECT_NE(err.find("line 3"), std::string::npos) << err;
}

TEST(ThreadsTest, ConcurrentEncodeAndDecodeAgreeWithSerial) {
  auto tok = Tokenizer::Load(kQwen3);
  ASSERT_TRUE(tok.ok());
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("Sample " + std::to_string(i * 7919) + ": the caf\xC3\xA9 at " + std::to_string(i) +
                    " \xE4\xB8\xAD\xE6\x96\x87 words repeat words repeat\n");
  }
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(*(*tok)->Encode(t));
  std::vector<std::thread> threads;
  std::vector<int> errors(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = w; i < texts.size(); i += (round % 2) + 1) {
          auto ids = (*tok)->Encode(texts[i]);
          if (!ids.ok() || *ids != serial[i] || *(*tok)->Decode(*ids) != texts[i]) ++errors[w];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace icecache::tokenizer
