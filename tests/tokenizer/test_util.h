// Helpers shared by the tokenizer tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace icecache::tokenizer::testing {

inline std::string SourcePath(const std::string& rel) { return std::string(ICECACHE_SOURCE_DIR) + "/" + rel; }

// A fresh directory under the system temp dir, unique per test.
inline std::filesystem::path TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("icecache_tok_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
              std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path.string();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace icecache::tokenizer::testing
