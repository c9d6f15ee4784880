// Safetensors checkpoints: header parsing (strictly validated), memory-mapped files, sharded
// checkpoints (model.safetensors.index.json), and a writer.
//
// File format: 8-byte little-endian header length N, N bytes of JSON header, then the data
// buffer. The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} with
// offsets relative to the start of the data buffer; "__metadata__" holds string pairs.
// Supported dtypes: BF16, F16, F32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/dtype.h"

namespace icecache::model {

struct TensorInfo {
  std::string name;
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;
  int64_t numel() const;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // absolute file offset of the data buffer (8 + N)
  std::vector<TensorInfo> tensors;  // sorted by begin
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a safetensors file whose complete contents are
// bytes[0, size). Checks: the length prefix fits in the file and is at most 100 MiB; the header is
// a JSON object; every entry has a supported dtype, a shape of non-negative integers, and
// data_offsets with begin <= end inside the data buffer; byte size == numel * dtype size; entries
// do not overlap. Never crashes on arbitrary bytes. Errors (DATA_LOSS for truncation,
// INVALID_ARGUMENT otherwise) start with `source` and name the tensor at fault.
StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* bytes, size_t size, std::string_view source);

// A read-only memory mapping of a whole file. Move-only; unmaps on destruction.
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A view of one tensor inside a mapped file; valid while the owning Checkpoint lives.
struct TensorView {
  const TensorInfo* info = nullptr;
  const void* data = nullptr;
  const std::string* file = nullptr;  // path of the file holding it
};

// All tensors of a checkpoint directory, memory-mapped (weights are never copied).
// Immutable after Open; const methods are thread-safe.
class Checkpoint {
 public:
  // Opens DIR/model.safetensors.index.json (sharded) if present, else DIR/model.safetensors.
  // Every shard's header is validated; the index's weight_map must match the shards' contents.
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // A checkpoint over tensors that live elsewhere (a GGUF file's, dequantised or mapped):
  // tensor i is described by infos[i] (begin/end give its byte size) and starts at data[i];
  // `owner` keeps every data pointer valid for the checkpoint's life. `source` names the file in
  // messages. INVALID_ARGUMENT for a repeated name or mismatched vector sizes.
  static StatusOr<std::unique_ptr<Checkpoint>> FromTensors(std::string source, std::vector<TensorInfo> infos,
                                                           std::vector<const void*> data,
                                                           std::shared_ptr<const void> owner);

  // NOT_FOUND "FILE: tensor 'NAME' is missing" when absent.
  StatusOr<TensorView> Get(const std::string& name) const;
  bool Contains(const std::string& name) const { return tensors_.count(name) > 0; }
  // Get + checks that the shape equals `shape` (INVALID_ARGUMENT naming file, tensor, both shapes).
  StatusOr<TensorView> GetWithShape(const std::string& name, const std::vector<int64_t>& shape) const;
  size_t num_tensors() const { return tensors_.size(); }
  const std::string& dir() const { return dir_; }
  // Names of all tensors, sorted.
  std::vector<std::string> TensorNames() const;

 private:
  struct Shard {
    std::unique_ptr<MappedFile> file;
    SafetensorsHeader header;
  };
  std::string dir_;
  std::string index_path_;  // empty when not sharded
  std::vector<Shard> shards_;
  std::map<std::string, TensorView> tensors_;
  // FromTensors: the file named in messages, the tensor infos and what keeps the data alive.
  std::string source_;
  std::vector<TensorInfo> infos_;
  std::shared_ptr<const void> owner_;
};

// One tensor to write: `data` holds numel * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Writes a safetensors file (header padded to 8 bytes; tensors in the given order).
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

std::string ShapeToString(const std::vector<int64_t>& shape);  // "[3, 4]"

}  // namespace icecache::model
