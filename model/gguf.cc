#include "model/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

namespace icecache::model {
namespace {

constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;

size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray: return 0;
  }
  return 0;
}

bool IsInteger(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64: return true;
    default: return false;
  }
}

bool IsFloat(GgufValueType t) { return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64; }

std::string TypeName(GgufValueType t) {
  static const char* const kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                       "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "type " + std::to_string(i);
}

// Decodes one little-endian scalar of type t at p into *i (integers, bools) or *f (floats).
// Returns false for a uint64 above INT64_MAX.
bool DecodeScalar(GgufValueType t, const uint8_t* p, int64_t* i, double* f) {
  uint64_t u = 0;
  const size_t n = ScalarSize(t);
  for (size_t k = 0; k < n; ++k) u |= static_cast<uint64_t>(p[k]) << (8 * k);
  switch (t) {
    case GgufValueType::kUint8: *i = static_cast<uint8_t>(u); break;
    case GgufValueType::kInt8: *i = static_cast<int8_t>(u); break;
    case GgufValueType::kBool: *i = u != 0; break;
    case GgufValueType::kUint16: *i = static_cast<uint16_t>(u); break;
    case GgufValueType::kInt16: *i = static_cast<int16_t>(u); break;
    case GgufValueType::kUint32: *i = static_cast<uint32_t>(u); break;
    case GgufValueType::kInt32: *i = static_cast<int32_t>(u); break;
    case GgufValueType::kUint64:
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *i = static_cast<int64_t>(u);
      break;
    case GgufValueType::kInt64: *i = static_cast<int64_t>(u); break;
    case GgufValueType::kFloat32: {
      uint32_t w = static_cast<uint32_t>(u);
      float v;
      std::memcpy(&v, &w, 4);
      *f = v;
      break;
    }
    case GgufValueType::kFloat64: std::memcpy(f, &u, 8); break;
    default: break;
  }
  return true;
}

// A bounds-checked little-endian cursor over the file.
class Reader {
 public:
  Reader(const uint8_t* bytes, size_t size, std::string_view source) : p_(bytes), size_(size), source_(source) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return p_ + pos_; }

  Status Truncated(const std::string& what) const {
    return DataLossError(std::string(source_) + ": truncated: " + what + " runs past the end of the file (" +
                         std::to_string(size_) + " bytes)");
  }
  Status Need(uint64_t n, const std::string& what) const { return n > remaining() ? Truncated(what) : Status::Ok(); }
  Status U32(uint32_t* v, const std::string& what) {
    ICE_RETURN_IF_ERROR(Need(4, what));
    *v = 0;
    for (int k = 0; k < 4; ++k) *v |= static_cast<uint32_t>(p_[pos_ + k]) << (8 * k);
    pos_ += 4;
    return Status::Ok();
  }
  Status U64(uint64_t* v, const std::string& what) {
    ICE_RETURN_IF_ERROR(Need(8, what));
    *v = 0;
    for (int k = 0; k < 8; ++k) *v |= static_cast<uint64_t>(p_[pos_ + k]) << (8 * k);
    pos_ += 8;
    return Status::Ok();
  }
  Status String(std::string_view* s, const std::string& what) {
    uint64_t n = 0;
    ICE_RETURN_IF_ERROR(U64(&n, what + " length"));
    if (n > kMaxStringBytes) {
      return InvalidArgumentError(std::string(source_) + ": " + what + " has length " + std::to_string(n) +
                                  " (more than 1 GiB)");
    }
    ICE_RETURN_IF_ERROR(Need(n, what));
    *s = std::string_view(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return Status::Ok();
  }
  void Skip(uint64_t n) { pos_ += n; }  // REQUIRES: Need(n) was checked

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string_view source_;
};

// Printable form of a key or tensor name for messages (bytes outside printable ASCII as \xNN).
std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 200) out += "...";
  return out;
}

Status ReadValue(Reader& r, GgufValueType type, const std::string& where, std::string_view source, GgufValue* v) {
  v->type = type;
  if (type == GgufValueType::kString) return r.String(&v->str, where);
  if (type == GgufValueType::kArray) {
    uint32_t et;
    ICE_RETURN_IF_ERROR(r.U32(&et, where + " element type"));
    uint64_t count;
    ICE_RETURN_IF_ERROR(r.U64(&count, where + " element count"));
    if (et > static_cast<uint32_t>(GgufValueType::kFloat64)) {
      return InvalidArgumentError(std::string(source) + ": " + where + " has unknown element type " +
                                  std::to_string(et));
    }
    v->elem_type = static_cast<GgufValueType>(et);
    v->count = count;
    if (v->elem_type == GgufValueType::kArray) {
      return InvalidArgumentError(std::string(source) + ": " + where + " is an array of arrays (not supported)");
    }
    if (v->elem_type == GgufValueType::kString) {
      // Every string takes at least its 8-byte length: bounds the count before reserving.
      if (count > r.remaining() / 8) return r.Truncated(where + " (" + std::to_string(count) + " strings)");
      v->strings.resize(count);
      for (uint64_t k = 0; k < count; ++k) {
        ICE_RETURN_IF_ERROR(r.String(&v->strings[k], where + "[" + std::to_string(k) + "]"));
      }
      return Status::Ok();
    }
    const uint64_t es = ScalarSize(v->elem_type);
    if (count > r.remaining() / es) return r.Truncated(where + " (" + std::to_string(count) + " elements)");
    v->raw = r.here();
    if (v->elem_type == GgufValueType::kUint64) {
      for (uint64_t k = 0; k < count; ++k) {
        int64_t i;
        double f;
        if (!DecodeScalar(v->elem_type, v->raw + k * es, &i, &f)) {
          return InvalidArgumentError(std::string(source) + ": " + where + "[" + std::to_string(k) +
                                      "] is a uint64 above 2^63 - 1");
        }
      }
    }
    r.Skip(count * es);
    return Status::Ok();
  }
  if (static_cast<uint32_t>(type) > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return InvalidArgumentError(std::string(source) + ": " + where + " has unknown value type " +
                                std::to_string(static_cast<uint32_t>(type)));
  }
  const size_t n = ScalarSize(type);
  ICE_RETURN_IF_ERROR(r.Need(n, where));
  if (!DecodeScalar(type, r.here(), &v->i, &v->f)) {
    return InvalidArgumentError(std::string(source) + ": " + where + " is a uint64 above 2^63 - 1");
  }
  if (type == GgufValueType::kBool && r.here()[0] > 1) {
    return InvalidArgumentError(std::string(source) + ": " + where + " is a bool with value " +
                                std::to_string(r.here()[0]));
  }
  r.Skip(n);
  return Status::Ok();
}

}  // namespace

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

StatusOr<GgufContents> ParseGguf(const uint8_t* bytes, size_t size, std::string_view source) {
  GgufContents c;
  c.source = std::string(source);
  const std::string src(source);
  Reader r(bytes, size, source);
  ICE_RETURN_IF_ERROR(r.Need(4, "the magic"));
  if (std::memcmp(bytes, "GGUF", 4) != 0) {
    return InvalidArgumentError(src + ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
  }
  r.Skip(4);
  ICE_RETURN_IF_ERROR(r.U32(&c.version, "the version"));
  if (c.version != 2 && c.version != 3) {
    return InvalidArgumentError(src + ": GGUF version " + std::to_string(c.version) +
                                " is not supported (2 and 3 are)");
  }
  uint64_t tensor_count, kv_count;
  ICE_RETURN_IF_ERROR(r.U64(&tensor_count, "the tensor count"));
  ICE_RETURN_IF_ERROR(r.U64(&kv_count, "the metadata count"));
  // Each entry takes at least 12 (metadata) or 24 (tensor) bytes.
  if (kv_count > r.remaining() / 12) return r.Truncated(std::to_string(kv_count) + " metadata entries");
  if (tensor_count > r.remaining() / 24) return r.Truncated(std::to_string(tensor_count) + " tensor infos");

  for (uint64_t k = 0; k < kv_count; ++k) {
    std::string_view key;
    ICE_RETURN_IF_ERROR(r.String(&key, "metadata key " + std::to_string(k)));
    if (key.empty()) return InvalidArgumentError(src + ": metadata key " + std::to_string(k) + " is empty");
    const std::string where = "metadata '" + Printable(key) + "'";
    uint32_t type;
    ICE_RETURN_IF_ERROR(r.U32(&type, where + " type"));
    GgufValue v;
    ICE_RETURN_IF_ERROR(ReadValue(r, static_cast<GgufValueType>(type), where, source, &v));
    if (!c.metadata.emplace(std::string(key), std::move(v)).second) {
      return InvalidArgumentError(src + ": " + where + " appears twice");
    }
  }
  if (const GgufValue* a = c.Find("general.alignment")) {
    if (a->type != GgufValueType::kUint32 || a->i == 0 || (a->i & (a->i - 1)) != 0) {
      return InvalidArgumentError(src + ": metadata 'general.alignment' must be a uint32 power of two");
    }
    c.alignment = static_cast<uint64_t>(a->i);
  }

  std::set<std::string_view> names;
  c.tensors.reserve(tensor_count);
  for (uint64_t k = 0; k < tensor_count; ++k) {
    std::string_view name;
    ICE_RETURN_IF_ERROR(r.String(&name, "tensor name " + std::to_string(k)));
    GgufTensor t;
    t.name = std::string(name);
    const std::string where = "tensor '" + Printable(name) + "'";
    if (name.empty()) return InvalidArgumentError(src + ": tensor " + std::to_string(k) + " has an empty name");
    uint32_t n_dims;
    ICE_RETURN_IF_ERROR(r.U32(&n_dims, where + " dimension count"));
    if (n_dims < 1 || n_dims > 4) {
      return InvalidArgumentError(src + ": " + where + " has " + std::to_string(n_dims) +
                                  " dimensions (1 to 4 allowed)");
    }
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t n;
      ICE_RETURN_IF_ERROR(r.U64(&n, where + " dimensions"));
      if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(numel)) {
        return InvalidArgumentError(src + ": " + where + " has dimension " + std::to_string(d) + " = " +
                                    std::to_string(n) + (n == 0 ? " (must be >= 1)" : " (element count overflows)"));
      }
      numel *= static_cast<int64_t>(n);
      t.ne.push_back(static_cast<int64_t>(n));
    }
    uint32_t type;
    ICE_RETURN_IF_ERROR(r.U32(&type, where + " type"));
    if (!GgmlTypeSupported(type)) {
      return InvalidArgumentError(src + ": " + where + " has type " + GgmlTypeName(type) +
                                  ", which icecache does not load (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                                  "Q5_1, Q4_K, Q5_K, Q6_K)");
    }
    t.type = static_cast<GgmlType>(type);
    if (t.ne[0] % GgmlBlockValues(t.type) != 0) {
      return InvalidArgumentError(src + ": " + where + " has rows of " + std::to_string(t.ne[0]) +
                                  " values, not a multiple of the " + GgmlTypeName(type) + " block size " +
                                  std::to_string(GgmlBlockValues(t.type)));
    }
    auto bytes_or = GgmlBytes(t.type, numel);
    if (!bytes_or.ok()) return bytes_or.status().WithContext(src + ": " + where);
    t.bytes = *bytes_or;
    ICE_RETURN_IF_ERROR(r.U64(&t.offset, where + " offset"));
    if (t.offset % c.alignment != 0) {
      return InvalidArgumentError(src + ": " + where + " has offset " + std::to_string(t.offset) +
                                  ", not a multiple of the alignment " + std::to_string(c.alignment));
    }
    if (!names.insert(name).second) return InvalidArgumentError(src + ": " + where + " appears twice");
    c.tensors.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment.
  const uint64_t end = r.pos();
  const uint64_t pad = (c.alignment - end % c.alignment) % c.alignment;
  c.data_offset = end + pad;
  if (c.data_offset > size && !c.tensors.empty()) return r.Truncated("the padding before the data section");
  std::vector<size_t> order(c.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (GgufTensor& t : c.tensors) {
    const uint64_t room = size - c.data_offset;
    if (t.offset > room || t.bytes > room - t.offset) {
      return DataLossError(src + ": truncated: tensor '" + Printable(t.name) + "' (" +
                           GgmlTypeName(static_cast<uint32_t>(t.type)) + " " + ShapeToString(t.shape()) + ", " +
                           std::to_string(t.bytes) + " bytes at data offset " + std::to_string(t.offset) +
                           ") runs past the end of the file");
    }
    t.offset += c.data_offset;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return c.tensors[a].offset < c.tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensor& prev = c.tensors[order[i - 1]];
    const GgufTensor& cur = c.tensors[order[i]];
    if (prev.offset + prev.bytes > cur.offset) {
      return InvalidArgumentError(src + ": tensors '" + Printable(prev.name) + "' and '" + Printable(cur.name) +
                                  "' overlap");
    }
  }
  return c;
}

const GgufValue* GgufContents::Find(std::string_view key) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

const GgufTensor* GgufContents::FindTensor(std::string_view name) const {
  for (const GgufTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

StatusOr<const GgufValue*> FindTyped(const GgufContents& c, std::string_view key) {
  const GgufValue* v = c.Find(key);
  if (v == nullptr) return NotFoundError(c.source + ": metadata key '" + std::string(key) + "' is missing");
  return v;
}

Status WrongType(const GgufContents& c, std::string_view key, const GgufValue& v, const char* want) {
  std::string have = TypeName(v.type);
  if (v.type == GgufValueType::kArray) have += " of " + TypeName(v.elem_type);
  return InvalidArgumentError(c.source + ": metadata '" + std::string(key) + "' is a " + have + ", expected " + want);
}

}  // namespace

StatusOr<int64_t> GgufContents::GetInt(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (!IsInteger(v->type)) return WrongType(*this, key, *v, "an integer");
  return v->i;
}

StatusOr<double> GgufContents::GetFloat(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (IsFloat(v->type)) return v->f;
  if (IsInteger(v->type)) return static_cast<double>(v->i);
  return WrongType(*this, key, *v, "a number");
}

StatusOr<bool> GgufContents::GetBool(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (v->type != GgufValueType::kBool) return WrongType(*this, key, *v, "a bool");
  return v->i != 0;
}

StatusOr<std::string> GgufContents::GetString(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (v->type != GgufValueType::kString) return WrongType(*this, key, *v, "a string");
  return std::string(v->str);
}

StatusOr<std::vector<std::string_view>> GgufContents::GetStringArray(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString) {
    return WrongType(*this, key, *v, "an array of strings");
  }
  return v->strings;
}

StatusOr<std::vector<int64_t>> GgufContents::GetIntArray(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (v->type != GgufValueType::kArray || !(IsInteger(v->elem_type) || v->elem_type == GgufValueType::kBool)) {
    return WrongType(*this, key, *v, "an array of integers");
  }
  std::vector<int64_t> out(v->count);
  const size_t es = ScalarSize(v->elem_type);
  double f;
  for (uint64_t k = 0; k < v->count; ++k) DecodeScalar(v->elem_type, v->raw + k * es, &out[k], &f);
  return out;
}

StatusOr<std::vector<float>> GgufContents::GetFloatArray(std::string_view key) const {
  ICE_ASSIGN_OR_RETURN(const GgufValue* v, FindTyped(*this, key));
  if (v->type != GgufValueType::kArray || !(IsInteger(v->elem_type) || IsFloat(v->elem_type))) {
    return WrongType(*this, key, *v, "an array of numbers");
  }
  std::vector<float> out(v->count);
  const size_t es = ScalarSize(v->elem_type);
  for (uint64_t k = 0; k < v->count; ++k) {
    int64_t i = 0;
    double f = 0;
    DecodeScalar(v->elem_type, v->raw + k * es, &i, &f);
    out[k] = static_cast<float>(IsFloat(v->elem_type) ? f : static_cast<double>(i));
  }
  return out;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  ICE_ASSIGN_OR_RETURN(g->file_, MappedFile::Open(path));
  ICE_ASSIGN_OR_RETURN(g->contents_, ParseGguf(g->file_->data(), g->file_->size(), path));
  return g;
}

StatusOr<std::string> FindGgufInDirectory(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".gguf" && e.is_regular_file(ec)) found.push_back(e.path().string());
  }
  if (ec) return NotFoundError(dir + ": cannot list the directory: " + ec.message());
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    std::string list;
    for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
    return InvalidArgumentError(dir + ": holds several GGUF files (" + list + "); pass one with --model FILE.gguf");
  }
  return found.empty() ? std::string() : found[0];
}

}  // namespace icecache::model
