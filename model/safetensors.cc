#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace icecache::model {
namespace {

using Json = nlohmann::json;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool ParseDType(const std::string& s, kernels::DType* out) {
  if (s == "BF16") *out = kernels::DType::kBF16;
  else if (s == "F16") *out = kernels::DType::kF16;
  else if (s == "F32") *out = kernels::DType::kF32;
  else return false;
  return true;
}

const char* DTypeTag(kernels::DType t) {
  switch (t) {
    case kernels::DType::kBF16: return "BF16";
    case kernels::DType::kF16: return "F16";
    case kernels::DType::kF32: return "F32";
    default: break;  // no safetensors element type (a writer refuses it)
  }
  return "?";
}

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* bytes, size_t size, std::string_view source) {
  const std::string src(source);
  if (size < 8) {
    return DataLossError(src + ": file is " + std::to_string(size) + " bytes, too short for a safetensors header");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeaderBytes) {
    return InvalidArgumentError(src + ": header length " + std::to_string(n) + " exceeds the 100 MiB limit (corrupt file?)");
  }
  if (n > size - 8) {
    return DataLossError(src + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(size) + " bytes; truncated?)");
  }
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - h.data_offset;

  Json j;
  try {
    j = Json::parse(bytes + 8, bytes + 8 + n);
  } catch (const std::exception& e) {
    return InvalidArgumentError(src + ": header is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(src + ": header must be a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return InvalidArgumentError(src + ": __metadata__ must be an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return InvalidArgumentError(src + ": __metadata__ values must be strings");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = src + ": tensor '" + name + "'";
    if (!v.is_object()) return InvalidArgumentError(where + ": entry must be an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return InvalidArgumentError(where + ": missing string 'dtype'");
    if (sh == v.end() || !sh->is_array()) return InvalidArgumentError(where + ": missing list 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      return InvalidArgumentError(where + ": 'data_offsets' must be a list [begin, end]");
    }
    TensorInfo t;
    t.name = name;
    if (!ParseDType(dt->get<std::string>(), &t.dtype)) {
      return InvalidArgumentError(where + ": dtype '" + dt->get<std::string>() + "' is not supported (BF16, F16, F32)");
    }
    uint64_t numel = 1;
    for (const Json& d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        return InvalidArgumentError(where + ": shape entries must be non-negative integers");
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim != 0 && numel > (1ull << 40) / dim)) {
        return InvalidArgumentError(where + ": shape is implausibly large");
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const Json& o : *off) {
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0)) {
        return InvalidArgumentError(where + ": data_offsets must be non-negative integers");
      }
    }
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end) return InvalidArgumentError(where + ": data_offsets begin > end");
    if (t.end > data_size) {
      return DataLossError(where + ": data_offsets end " + std::to_string(t.end) + " is past the data buffer (" +
                           std::to_string(data_size) + " bytes; truncated file?)");
    }
    const uint64_t expect = numel * kernels::DTypeSize(t.dtype);
    if (t.end - t.begin != expect) {
      return InvalidArgumentError(where + ": " + std::to_string(t.end - t.begin) + " bytes do not match dtype " +
                                  dt->get<std::string>() + " and shape " + ShapeToString(t.shape) + " (" +
                                  std::to_string(expect) + " bytes)");
    }
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    if (h.tensors[i].begin < h.tensors[i - 1].end) {
      return InvalidArgumentError(src + ": tensors '" + h.tensors[i - 1].name + "' and '" + h.tensors[i].name +
                                  "' overlap in the data buffer");
    }
  }
  return h;
}

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(path + ": no such file");
    return UnavailableError(path + ": cannot open: " + ErrnoText());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string err = ErrnoText();
    ::close(fd);
    return UnavailableError(path + ": fstat failed: " + err);
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string err = ErrnoText();
      ::close(fd);
      return UnavailableError(path + ": mmap failed: " + err);
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // tensor -> file name
  struct stat st;
  if (::stat(index_path.c_str(), &st) == 0) {
    c->index_path_ = index_path;
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    Json j;
    try {
      j = Json::parse(ss.str());
    } catch (const std::exception& e) {
      return InvalidArgumentError(index_path + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return InvalidArgumentError(index_path + ": missing object 'weight_map'");
    }
    std::set<std::string> seen;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return InvalidArgumentError(index_path + ": weight_map values must be file names");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        return InvalidArgumentError(index_path + ": weight_map file name '" + f + "' must be a plain file name");
      }
      weight_map[it.key()] = f;
      if (seen.insert(f).second) files.push_back(f);
    }
    if (files.empty()) return InvalidArgumentError(index_path + ": weight_map is empty");
  } else {
    files.push_back("model.safetensors");
    if (::stat((dir + "/model.safetensors").c_str(), &st) != 0) {
      return NotFoundError(dir + ": neither model.safetensors nor model.safetensors.index.json exists");
    }
  }
  for (const std::string& f : files) {
    Shard shard;
    ICE_ASSIGN_OR_RETURN(shard.file, MappedFile::Open(dir + "/" + f));
    ICE_ASSIGN_OR_RETURN(shard.header,
                         ParseSafetensorsHeader(shard.file->data(), shard.file->size(), shard.file->path()));
    c->shards_.push_back(std::move(shard));
  }
  for (const Shard& shard : c->shards_) {
    for (const TensorInfo& t : shard.header.tensors) {
      TensorView v{&t, shard.file->data() + shard.header.data_offset + t.begin, &shard.file->path()};
      if (!c->tensors_.emplace(t.name, v).second) {
        return InvalidArgumentError(shard.file->path() + ": tensor '" + t.name + "' also appears in another shard");
      }
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = c->tensors_.find(name);
    if (it == c->tensors_.end()) {
      return NotFoundError(dir + "/" + file + ": tensor '" + name + "' listed in " + index_path + " is missing");
    }
    if (*it->second.file != dir + "/" + file) {
      return InvalidArgumentError(index_path + ": tensor '" + name + "' is listed in " + file + " but stored in " +
                                  *it->second.file);
    }
  }
  return c;
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::FromTensors(std::string source, std::vector<TensorInfo> infos,
                                                              std::vector<const void*> data,
                                                              std::shared_ptr<const void> owner) {
  if (infos.size() != data.size()) return InvalidArgumentError(source + ": tensor infos and data differ in number");
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = source;
  c->source_ = std::move(source);
  c->infos_ = std::move(infos);
  c->owner_ = std::move(owner);
  for (size_t i = 0; i < c->infos_.size(); ++i) {
    TensorView v{&c->infos_[i], data[i], &c->source_};
    if (!c->tensors_.emplace(c->infos_[i].name, v).second) {
      return InvalidArgumentError(c->source_ + ": tensor '" + c->infos_[i].name + "' appears twice");
    }
  }
  return c;
}

StatusOr<TensorView> Checkpoint::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string where = !source_.empty()      ? source_
                        : index_path_.empty() ? dir_ + "/model.safetensors"
                                              : index_path_;
    return NotFoundError(where + ": tensor '" + name + "' is missing");
  }
  return it->second;
}

StatusOr<TensorView> Checkpoint::GetWithShape(const std::string& name, const std::vector<int64_t>& shape) const {
  ICE_ASSIGN_OR_RETURN(TensorView v, Get(name));
  if (v.info->shape != shape) {
    return InvalidArgumentError(*v.file + ": tensor '" + name + "' has shape " + ShapeToString(v.info->shape) +
                                ", expected " + ShapeToString(shape) + " from the model config");
  }
  return v;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, v] : tensors_) names.push_back(name);
  return names;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (kernels::IsBlockQuantized(t.dtype)) {
      return InvalidArgumentError(path + ": tensor '" + t.name + "' is " + std::string(kernels::DTypeName(t.dtype)) +
                                  "; safetensors holds f32, f16 and bf16 tensors only");
    }
    if (t.data.size() != static_cast<size_t>(numel) * kernels::DTypeSize(t.dtype)) {
      return InvalidArgumentError(path + ": tensor '" + t.name + "' data size does not match its shape");
    }
    header[t.name] = {{"dtype", DTypeTag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return UnavailableError(path + ": cannot open for writing");
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& t : tensors) out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  out.close();
  if (!out) return UnavailableError(path + ": write failed");
  return Status::Ok();
}

}  // namespace icecache::model
