// GGUF files (llama.cpp's single-file checkpoints): a strictly validated parser of the header,
// metadata and tensor table, over a memory mapping.
//
// Layout (version 2 and 3; all little-endian):
//   "GGUF", u32 version, u64 tensor_count, u64 metadata_count,
//   metadata_count x (string key, u32 value type, value),
//   tensor_count x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset),
//   padding to `general.alignment` (default 32), then the data section; each tensor's offset is
//   relative to the data section and a multiple of the alignment.
// A string is u64 length + bytes; an array is u32 element type, u64 count, elements. ne[0] is the
// fastest-varying dimension (a row of a weight matrix), so the row-major shape is ne reversed.
//
// Every error is an icecache::Status whose message starts with the file name (the `source`) and
// names the key or tensor at fault: DATA_LOSS for truncation (something runs past the end of the
// file), INVALID_ARGUMENT for anything malformed or unsupported. Parsing never reads outside the
// given bytes, whatever they hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/gguf_dequant.h"
#include "model/safetensors.h"

namespace icecache::model {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// One metadata value. Scalars: integers in `i` (unsigned values above INT64_MAX are refused at
// parse time), floats in `f`, bools in `i` (0/1), strings in `str`. Arrays (of scalars or strings;
// nested arrays are refused): elem_type, count, and either `strings` or the raw little-endian
// elements at `raw` (count * element size bytes). Views point into the parsed bytes.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  int64_t i = 0;
  double f = 0;
  std::string_view str;
  GgufValueType elem_type = GgufValueType::kUint8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;
  std::vector<std::string_view> strings;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] fastest; 1 to 4 dims, each >= 1
  uint64_t offset = 0;      // absolute file offset of the data
  uint64_t bytes = 0;
  int64_t numel() const;
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }  // row-major
};

struct GgufContents {
  std::string source;
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;
  std::map<std::string, GgufValue, std::less<>> metadata;
  std::vector<GgufTensor> tensors;  // in file order

  const GgufValue* Find(std::string_view key) const;
  const GgufTensor* FindTensor(std::string_view name) const;

  // Typed access. NOT_FOUND "SOURCE: metadata key 'K' is missing"; INVALID_ARGUMENT when the
  // value has another type (any integer type is accepted for the integer getters, any float or
  // integer for GetFloat) or is out of range.
  StatusOr<int64_t> GetInt(std::string_view key) const;
  StatusOr<double> GetFloat(std::string_view key) const;
  StatusOr<bool> GetBool(std::string_view key) const;
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<std::vector<std::string_view>> GetStringArray(std::string_view key) const;
  // Integer or float arrays converted element by element.
  StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
};

// Parses and validates bytes[0, size), the complete contents of a GGUF file. Checks: magic,
// version 2 or 3, counts that fit in the file, string lengths inside the file, value and element
// types known, no duplicate key or tensor name, general.alignment (if present) a u32 power of two,
// 1 <= n_dims <= 4, every dim >= 1, numel and byte size without overflow, ne[0] a multiple of the
// block size, type supported (GgmlTypeSupported; others are named), offset aligned, data inside the
// file, tensors not overlapping. The returned views point into `bytes`.
StatusOr<GgufContents> ParseGguf(const uint8_t* bytes, size_t size, std::string_view source);

// A parsed GGUF file kept mapped. Immutable; thread-safe.
class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  const GgufContents& contents() const { return contents_; }
  const uint8_t* data(const GgufTensor& t) const { return file_->data() + t.offset; }
  const std::string& path() const { return file_->path(); }

 private:
  std::unique_ptr<MappedFile> file_;
  GgufContents contents_;
};

// The one *.gguf file of directory `dir` ("" when there is none and no error);
// INVALID_ARGUMENT naming them when there are several.
StatusOr<std::string> FindGgufInDirectory(const std::string& dir);

}  // namespace icecache::model
