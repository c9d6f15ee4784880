// Bad GGUF files: hand-made corruptions get the documented error codes and messages, and random
// truncations and byte flips of a real fixture never crash and end in an error or in a parse
// whose tensors all lie inside the file.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_model.h"

namespace icecache::model {
namespace {

const std::string kDir = std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/gguf/";

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// A minimal GGUF builder for hand-made cases.
struct Builder {
  std::vector<uint8_t> b;
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Str(const std::string& s) {
    U64(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void Header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    b = {'G', 'G', 'U', 'F'};
    U32(version);
    U64(tensors);
    U64(kvs);
  }
  // One F32 tensor "t" of n values at data offset `offset`.
  void Tensor(const std::string& name, uint64_t n, uint64_t offset, uint32_t type = 0) {
    Str(name);
    U32(1);
    U64(n);
    U32(type);
    U64(offset);
  }
  void PadAndData(size_t data_bytes, size_t alignment = 32) {
    while (b.size() % alignment) b.push_back(0);
    b.resize(b.size() + data_bytes, 0);
  }
};

Status Parse(const std::vector<uint8_t>& b) { return ParseGguf(b.data(), b.size(), "bad.gguf").status(); }

// Cases expecting INVALID_ARGUMENT get trailing zero bytes, so that the element counts pass the
// "fits in the file" bound and the parser reaches the problem under test.
void ExpectError(std::vector<uint8_t> b, StatusCode code, const std::string& words) {
  if (code == StatusCode::kInvalidArgument) b.resize(b.size() + 256, 0);
  Status s = Parse(b);
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.message().rfind("bad.gguf: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
}

TEST(GgufFuzzTest, HandMadeCorruptions) {
  Builder g;
  g.Header(1, 0);
  g.Tensor("t", 8, 0);
  g.PadAndData(32);
  ASSERT_TRUE(Parse(g.b).ok()) << Parse(g.b).ToString();

  ExpectError({'G', 'G', 'U'}, StatusCode::kDataLoss, "magic");
  ExpectError({'G', 'G', 'M', 'L', 3, 0, 0, 0}, StatusCode::kInvalidArgument, "not a GGUF file");
  g.Header(0, 0, 1);
  ExpectError(g.b, StatusCode::kInvalidArgument, "version 1");
  g.Header(0, uint64_t{1} << 60);
  ExpectError(g.b, StatusCode::kDataLoss, "metadata entries");
  g.Header(uint64_t{1} << 62, 0);
  ExpectError(g.b, StatusCode::kDataLoss, "tensor infos");

  g.Header(0, 1);
  g.U64(uint64_t{1} << 40);  // key length 1 TiB
  ExpectError(g.b, StatusCode::kInvalidArgument, "more than 1 GiB");
  g.Header(0, 1);
  g.Str("k");
  g.U32(99);
  ExpectError(g.b, StatusCode::kInvalidArgument, "unknown value type 99");
  g.Header(0, 1);
  g.Str("k");
  g.U32(9);
  g.U32(9);
  g.U64(1);
  ExpectError(g.b, StatusCode::kInvalidArgument, "array of arrays");
  g.Header(0, 1);
  g.Str("k");
  g.U32(9);
  g.U32(8);
  g.U64(uint64_t{1} << 61);
  ExpectError(g.b, StatusCode::kDataLoss, "strings");
  g.Header(0, 2);
  g.Str("k");
  g.U32(4);
  g.U32(1);
  g.Str("k");
  g.U32(4);
  g.U32(1);
  ExpectError(g.b, StatusCode::kInvalidArgument, "appears twice");
  g.Header(0, 1);
  g.Str("general.alignment");
  g.U32(4);
  g.U32(24);
  ExpectError(g.b, StatusCode::kInvalidArgument, "power of two");
  g.Header(0, 1);
  g.Str("b");
  g.U32(7);
  g.b.push_back(2);
  ExpectError(g.b, StatusCode::kInvalidArgument, "bool with value 2");

  g.Header(1, 0);
  g.Tensor("t", 0, 0);
  ExpectError(g.b, StatusCode::kInvalidArgument, "must be >= 1");
  g.Header(1, 0);
  g.Str("t");
  g.U32(5);
  ExpectError(g.b, StatusCode::kInvalidArgument, "5 dimensions");
  g.Header(1, 0);
  g.Str("t");
  g.U32(2);
  g.U64(uint64_t{1} << 40);
  g.U64(uint64_t{1} << 40);
  ExpectError(g.b, StatusCode::kInvalidArgument, "overflows");
  g.Header(1, 0);
  g.Tensor("t", 32, 0, 9);  // Q8_1 (an activation type of ggml's, never a file's weights)
  ExpectError(g.b, StatusCode::kInvalidArgument, "type Q8_1, which icecache does not load");
  g.Header(1, 0);
  g.Tensor("t", 16, 0, 8);  // Q8_0 rows of 16
  ExpectError(g.b, StatusCode::kInvalidArgument, "not a multiple of the Q8_0 block size 32");
  g.Header(1, 0);
  g.Tensor("t", 8, 4);
  ExpectError(g.b, StatusCode::kInvalidArgument, "not a multiple of the alignment");
  g.Header(1, 0);
  g.Tensor("t", 8, 0);
  g.PadAndData(31);
  ExpectError(g.b, StatusCode::kDataLoss, "tensor 't'");
  g.Header(2, 0);
  g.Tensor("t", 8, 0);
  g.Tensor("t", 8, 32);
  g.PadAndData(64);
  ExpectError(g.b, StatusCode::kInvalidArgument, "appears twice");
  g.Header(2, 0);
  g.Tensor("a", 16, 0);
  g.Tensor("b", 8, 32);
  g.PadAndData(64);
  ExpectError(g.b, StatusCode::kInvalidArgument, "overlap");
}

TEST(GgufFuzzTest, ModelLevelErrorsNameTheProblem) {
  auto missing = LoadGgufModel(kDir + "nothing_here.gguf");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // A parsable GGUF that is no model: the dequant fixture has no llama.* keys.
  auto not_model = LoadGgufModel(kDir + "dequant.gguf");
  ASSERT_FALSE(not_model.ok());
  EXPECT_NE(not_model.status().message().find("dequant.gguf: metadata key 'llama."), std::string::npos)
      << not_model.status().ToString();
}

// Truncations at every metadata/tensor-info boundary region and random corruptions of the real
// fixture: the parser must return (no crash, no read outside the buffer) and an accepted file must
// keep every tensor inside it.
TEST(GgufFuzzTest, TruncationsAndByteFlipsNeverCrash) {
  const std::vector<uint8_t> good = ReadAll(kDir + "tiny_llama.gguf");
  ASSERT_GT(good.size(), 100000u);
  auto parsed = ParseGguf(good.data(), good.size(), "tiny_llama.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const size_t header_end = parsed->data_offset;
  std::mt19937_64 rng(7);
  int errors = 0;
  for (size_t len = 0; len < header_end; len += 1 + len / 64) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + len);
    Status s = Parse(cut);
    EXPECT_FALSE(s.ok()) << len;
    errors += !s.ok();
  }
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bad(good.begin(), good.begin() + header_end + (trial % 2 ? 0 : 4096));
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      size_t at = rng() % header_end;
      bad[at] = (trial % 3 == 0) ? 0xff : static_cast<uint8_t>(rng());
    }
    auto r = ParseGguf(bad.data(), bad.size(), "bad.gguf");
    if (!r.ok()) {
      ++errors;
      EXPECT_EQ(r.status().message().rfind("bad.gguf: ", 0), 0u) << r.status().message();
      continue;
    }
    for (const GgufTensor& t : r->tensors) {
      EXPECT_LE(t.offset + t.bytes, bad.size()) << t.name;
      EXPECT_GE(t.offset, r->data_offset) << t.name;
    }
  }
  EXPECT_GT(errors, 1000);
}

}  // namespace
}  // namespace icecache::model
