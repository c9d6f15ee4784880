// Helpers shared by the model tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/matmul.h"
#include "model/model.h"

namespace icecache::model::testing {

// Sets the process-wide matmul precision (kernels/matmul.h) for a scope. Tests whose claim is
// "fp32 throughout, only summation order differs" pin kFp32: with bf16 activations a difference
// in the last fp32 bit can flip an activation's bf16 rounding (2^-9 of it), so two paths that
// sum in different orders (prefill and decode, a batch and a row, TP and one rank) agree only to
// bf16 accuracy; the bf16 variants of those tests state that tolerance.
class ScopedMatmulPrecision {
 public:
  explicit ScopedMatmulPrecision(kernels::MatmulPrecision p) : saved_(kernels::GetMatmulPrecision()) {
    kernels::SetMatmulPrecision(p);
  }
  ~ScopedMatmulPrecision() { kernels::SetMatmulPrecision(saved_); }
  ScopedMatmulPrecision(const ScopedMatmulPrecision&) = delete;
  ScopedMatmulPrecision& operator=(const ScopedMatmulPrecision&) = delete;

 private:
  kernels::MatmulPrecision saved_;
};

// Load options with a GGUF's quantised weights as `w` (model/model.h, GgufWeights).
inline model::ModelLoadOptions WithGgufWeights(model::GgufWeights w) {
  model::ModelLoadOptions o;
  o.gguf_weights = w;
  return o;
}

inline std::string FixtureDir(const std::string& name) {
  return std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "icecache_model_test_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace icecache::model::testing
