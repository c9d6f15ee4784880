// Safetensors parsing and checkpoint loading: valid files, every kind of corruption, missing
// tensors and wrong shapes, and a fuzz-style test of the header parser.
#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "model/dense_kv_cache.h"
#include "model/model.h"
#include "model/random_checkpoint.h"
#include "tests/model/test_util.h"

namespace icecache::model {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

std::string MakeFile(const std::string& header_json, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header_json;
  out.append(data_bytes, '\x01');
  return out;
}

StatusOr<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "x.safetensors");
}

TEST(SafetensorsHeader, ParsesValidHeader) {
  auto h = Parse(MakeFile(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
                          R"("a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"e":{"dtype":"F16","shape":[0],"data_offsets":[32,32]}})",
                          32));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[0].dtype, kernels::DType::kBF16);
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].numel(), 6);
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, RejectsCorruptHeaders) {
  struct Case {
    std::string file;
    std::string needle;
  };
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<Case> cases = {
      {"abc", "too short"},
      {MakeFile("{" + ok_entry + "}", 8).substr(0, 20), "past the end of the file"},
      {MakeFile("{" + ok_entry + "}", 4), "past the data buffer"},
      {MakeFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "do not match"},
      {MakeFile(R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8), "not supported"},
      {MakeFile(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative"},
      {MakeFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "begin > end"},
      {MakeFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets"},
      {MakeFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "overlap"},
      {MakeFile(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8), "implausibly"},
      {MakeFile("{\"t\": 5}", 0), "must be an object"},
      {MakeFile("[1,2]", 0), "JSON object"},
      {MakeFile("{\"t\":", 0), "not valid JSON"},
  };
  std::string huge(8, '\xff');
  cases.push_back({huge + "xxxx", "100 MiB"});
  for (const Case& c : cases) {
    auto h = Parse(c.file);
    ASSERT_FALSE(h.ok()) << c.needle;
    EXPECT_NE(h.status().message().find("x.safetensors"), std::string::npos) << h.status().message();
    EXPECT_NE(h.status().message().find(c.needle), std::string::npos) << h.status().message();
  }
}

// Random mutations of a real checkpoint file and random byte strings: the parser must return
// (OK or an error) without crashing, and an OK result must be internally consistent.
TEST(SafetensorsHeader, FuzzNeverCrashes) {
  const std::string base = ReadFile(testing::FixtureDir("llama_gqa_f32") + "/model.safetensors");
  ASSERT_GT(base.size(), 1000u);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base.data(), 8);
  std::mt19937_64 rng(42);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string f = base.substr(0, 8 + header_len + 64 * (iter % 5));
    const int kind = iter % 4;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t limit = kind == 0 ? 8 : 8 + header_len;  // kind 0: mutate the length prefix
      const size_t pos = rng() % std::min(limit, f.size());
      if (kind == 3) {
        static const char kChars[] = "{}[],:\"0123456789-eE.FBI";
        f[pos] = kChars[rng() % (sizeof(kChars) - 1)];
      } else {
        f[pos] = static_cast<char>(rng());
      }
    }
    if (iter % 7 == 0) f.resize(rng() % f.size());
    auto h = Parse(f);
    if (h.ok()) {
      ++ok;
      for (const TensorInfo& t : h->tensors) {
        ASSERT_LE(h->data_offset + t.end, f.size());
        ASSERT_EQ(t.end - t.begin, static_cast<uint64_t>(t.numel()) * kernels::DTypeSize(t.dtype));
      }
    }
  }
  for (int iter = 0; iter < 2000; ++iter) {
    std::string f(rng() % 64, '\0');
    for (char& c : f) c = static_cast<char>(rng());
    if (f.size() >= 8 && iter % 2 == 0) {
      const uint64_t n = f.size() - 8;
      std::memcpy(f.data(), &n, 8);
    }
    (void)Parse(f);
  }
  EXPECT_LT(ok, 3000);  // most mutations must be caught
}

class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    RandomModelSpec spec;
    spec.vocab = 300;
    spec.write_tokenizer = false;
    spec.dtype = kernels::DType::kF32;
    ASSERT_TRUE(WriteRandomCheckpoint(dir_.path(), spec).ok());
    file_ = dir_.path() + "/model.safetensors";
  }
  // Rewrites model.safetensors from the current tensors with `edit` applied.
  void Rewrite(const std::function<void(std::vector<TensorToWrite>*)>& edit) {
    auto ck = Checkpoint::Open(dir_.path());
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    std::vector<TensorToWrite> tensors;
    for (const std::string& name : (*ck)->TensorNames()) {
      TensorView v = *(*ck)->Get(name);
      TensorToWrite t{name, v.info->dtype, v.info->shape, {}};
      const auto* p = static_cast<const uint8_t*>(v.data);
      t.data.assign(p, p + (v.info->end - v.info->begin));
      tensors.push_back(std::move(t));
    }
    ck->reset();
    edit(&tensors);
    ASSERT_TRUE(WriteSafetensors(file_, tensors).ok());
  }
  std::string LoadError() {
    auto m = Model::Load(dir_.path());
    EXPECT_FALSE(m.ok());
    return m.ok() ? "" : m.status().message();
  }
  TempDir dir_;
  std::string file_;
};

TEST_F(CheckpointErrors, LoadsWhenIntact) {
  auto m = Model::Load(dir_.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->tokenizer(), nullptr);
}

TEST_F(CheckpointErrors, TruncatedFile) {
  std::string data = ReadFile(file_);
  WriteFile(file_, data.substr(0, data.size() - 100));
  std::string err = LoadError();
  EXPECT_NE(err.find(file_), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(CheckpointErrors, CorruptHeader) {
  std::string data = ReadFile(file_);
  data[8] = '#';
  WriteFile(file_, data);
  std::string err = LoadError();
  EXPECT_NE(err.find(file_), std::string::npos) << err;
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
}

TEST_F(CheckpointErrors, MissingTensor) {
  Rewrite([](auto* t) {
    t->erase(std::remove_if(t->begin(), t->end(), [](auto& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; }),
             t->end());
  });
  std::string err = LoadError();
  EXPECT_NE(err.find(file_), std::string::npos) << err;
  EXPECT_NE(err.find("'model.layers.1.mlp.up_proj.weight' is missing"), std::string::npos) << err;
}

TEST_F(CheckpointErrors, WrongShape) {
  Rewrite([](auto* t) {
    for (auto& x : *t) {
      if (x.name == "model.layers.0.self_attn.k_proj.weight") x.shape = {x.shape[1], x.shape[0]};
    }
  });
  std::string err = LoadError();
  EXPECT_NE(err.find(file_), std::string::npos) << err;
  EXPECT_NE(err.find("'model.layers.0.self_attn.k_proj.weight' has shape [64, 32], expected [32, 64]"),
            std::string::npos) << err;
}

TEST_F(CheckpointErrors, MissingFilesAndBadConfig) {
  std::filesystem::remove(file_);
  std::string err = LoadError();
  EXPECT_NE(err.find("neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << err;
  WriteFile(dir_.path() + "/config.json", R"({"architectures": ["FalconForCausalLM"]})");
  err = LoadError();
  EXPECT_NE(err.find("config.json: architecture 'FalconForCausalLM' is not supported"), std::string::npos) << err;
}

TEST_F(CheckpointErrors, ShardIndexMismatch) {
  WriteFile(dir_.path() + "/model.safetensors.index.json",
            R"({"weight_map": {"model.norm.weight": "model.safetensors", "extra.weight": "model.safetensors"}})");
  std::string err = LoadError();
  EXPECT_NE(err.find("'extra.weight'"), std::string::npos) << err;
  WriteFile(dir_.path() + "/model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "../etc/passwd"}})");
  err = LoadError();
  EXPECT_NE(err.find("plain file name"), std::string::npos) << err;
}

TEST_F(CheckpointErrors, TokenIdsOutOfRange) {
  auto m = Model::Load(dir_.path());
  ASSERT_TRUE(m.ok());
  DenseKvCache cache((*m)->attention_shape());
  ASSERT_TRUE(cache.AddSequence(1).ok());
  std::vector<int32_t> ids = {1, 300};
  std::vector<float> logits;
  SequenceInput in{1, ids};
  Status st = (*m)->Forward({&in, 1}, cache, LogitsMode::kAllTokens, &logits);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("token id 300"), std::string::npos) << st.message();
  EXPECT_EQ(*cache.SequenceLength(1), 0);
  ids = {-1};
  in.tokens = ids;
  EXPECT_EQ((*m)->Forward({&in, 1}, cache, LogitsMode::kAllTokens, &logits).code(), StatusCode::kOutOfRange);
}

// Test processes race for one cached checkpoint: each forked process ensures the same directory;
// all succeed, exactly one checkpoint is in place and loads, and no DIR.tmp.PID copy is left.
TEST(RandomCheckpoint, EnsureIsSafeWhenProcessesRaceAndKeepsAnExistingCheckpoint) {
  TempDir root;
  const std::string dir = root.path() + "/model";
  RandomModelSpec spec;
  spec.vocab = 300;
  spec.write_tokenizer = false;
  spec.dtype = kernels::DType::kF32;
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(EnsureRandomCheckpoint(dir, spec).ok() ? 0 : 1);
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(root.path())) entries.push_back(e.path().filename());
  EXPECT_EQ(entries, std::vector<std::string>{"model"});

  // An existing checkpoint is kept as it is (not compared with the spec, not rewritten).
  WriteFile(dir + "/marker", "kept");
  spec.seed = 99;
  ASSERT_TRUE(EnsureRandomCheckpoint(dir, spec).ok());
  EXPECT_EQ(ReadFile(dir + "/marker"), "kept");
}

}  // namespace
}  // namespace icecache::model
