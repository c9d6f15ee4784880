#include "model/gguf_model.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#if ICECACHE_HAVE_TOKENIZER
#include "model/shard_plan.h"
#include "model/tokenizer/gguf_vocab.h"
#endif

namespace icecache::model {
namespace {

using Json = nlohmann::json;

struct ArchInfo {
  const char* gguf_name;
  const char* hf_class;
  bool permuted_qk;  // the converter interleaved q/k rotary halves
};
constexpr ArchInfo kArchs[] = {
    {"llama", "LlamaForCausalLM", true},
    {"qwen2", "Qwen2ForCausalLM", false},
    {"qwen3", "Qwen3ForCausalLM", false},
};

StatusOr<const ArchInfo*> FindArch(const GgufContents& g) {
  ICE_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  for (const ArchInfo& a : kArchs) {
    if (arch == a.gguf_name) return &a;
  }
  return InvalidArgumentError(g.source + ": general.architecture '" + arch +
                              "' is not supported (supported: llama, qwen2, qwen3)");
}

// A positive integer key that fits a config field.
StatusOr<int64_t> PositiveInt(const GgufContents& g, const std::string& key) {
  ICE_ASSIGN_OR_RETURN(int64_t v, g.GetInt(key));
  if (v <= 0 || v > (int64_t{1} << 30)) {
    return InvalidArgumentError(g.source + ": metadata '" + key + "' = " + std::to_string(v) +
                                " is out of range [1, 2^30]");
  }
  return v;
}

StatusOr<int64_t> OptionalPositiveInt(const GgufContents& g, const std::string& key, int64_t fallback) {
  if (g.Find(key) == nullptr) return fallback;
  return PositiveInt(g, key);
}

// HF name of GGUF tensor `name`, "" when unknown.
std::string HfName(const std::string& name) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto& [g, h] : kTop) {
    if (name == g) return h;
  }
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},    {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},          {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.bias", "self_attn.o_proj.bias"},     {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},       {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  if (name.rfind("blk.", 0) != 0) return "";
  size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4 || dot - 4 > 6) return "";
  const std::string layer = name.substr(4, dot - 4);
  for (char c : layer) {
    if (c < '0' || c > '9') return "";
  }
  if (layer.size() > 1 && layer[0] == '0') return "";
  const std::string rest = name.substr(dot + 1);
  for (const auto& [g, h] : kLayer) {
    if (rest == g) return "model.layers." + layer + "." + h;
  }
  return "";
}

// Storage for the tensors that had to be rewritten; keeps the file mapped for the others.
struct Owner {
  std::shared_ptr<const GgufFile> file;
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<std::shared_ptr<void>> regions;  // lazily zeroed (anonymous mappings): sliced tensors
};

// `bytes` of anonymous memory: reads as zeros, costs memory only where written.
StatusOr<std::shared_ptr<void>> ZeroPages(size_t bytes) {
  const size_t len = std::max<size_t>(bytes, 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ResourceExhaustedError("cannot map " + std::to_string(bytes) + " bytes for a weight");
  return std::shared_ptr<void>(p, [len](void* q) { munmap(q, len); });
}

// The part of a 2-D weight one tensor-parallel rank reads (Model::BindWeights): rows
// [first, first + count) (column-parallel) or those columns (row-parallel); count 0: all of it.
struct RankSlice {
  bool columns = false;
  int64_t first = 0, count = 0;
};

RankSlice SliceOf(const std::string& hf, const ShardPlan& sp, const ModelConfig& c) {
  const int64_t d = c.head_dim;
  auto ends = [&](const char* suffix) {
    const std::string s = suffix;
    return hf.size() > s.size() && hf.compare(hf.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("self_attn.q_proj.weight")) return {false, sp.q_head0 * d, sp.q_heads * d};
  if (ends("self_attn.k_proj.weight") || ends("self_attn.v_proj.weight")) return {false, sp.kv_head0 * d, sp.kv_heads * d};
  if (ends("self_attn.o_proj.weight")) return {true, sp.q_head0 * d, sp.q_heads * d};
  if (ends("mlp.gate_proj.weight") || ends("mlp.up_proj.weight")) return {false, sp.inter0, sp.inter};
  if (ends("mlp.down_proj.weight")) return {true, sp.inter0, sp.inter};
  return {};
}

// The kernels' block type of a GGUF type that has one (q8_0, q4_0, q4_1), else kF32.
kernels::DType BlockDType(GgmlType t) {
  return t == GgmlType::kQ8_0   ? kernels::DType::kQ8_0
         : t == GgmlType::kQ4_0 ? kernels::DType::kQ4_0
         : t == GgmlType::kQ4_1 ? kernels::DType::kQ4_1
                                : kernels::DType::kF32;
}

kernels::DType PlainDType(GgmlType t) {
  return t == GgmlType::kF16    ? kernels::DType::kF16
         : t == GgmlType::kBF16 ? kernels::DType::kBF16
                                : kernels::DType::kF32;
}

}  // namespace

StatusOr<ModelConfig> GgufModelConfig(const GgufContents& g) {
  ICE_ASSIGN_OR_RETURN(const ArchInfo* arch, FindArch(g));
  const std::string p = std::string(arch->gguf_name) + ".";
  Json j;
  j["architectures"] = {arch->hf_class};
  ICE_ASSIGN_OR_RETURN(int64_t hidden, PositiveInt(g, p + "embedding_length"));
  ICE_ASSIGN_OR_RETURN(int64_t heads, PositiveInt(g, p + "attention.head_count"));
  ICE_ASSIGN_OR_RETURN(int64_t kv_heads, OptionalPositiveInt(g, p + "attention.head_count_kv", heads));
  j["hidden_size"] = hidden;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv_heads;
  ICE_ASSIGN_OR_RETURN(j["intermediate_size"], PositiveInt(g, p + "feed_forward_length"));
  ICE_ASSIGN_OR_RETURN(j["num_hidden_layers"], PositiveInt(g, p + "block_count"));
  ICE_ASSIGN_OR_RETURN(j["max_position_embeddings"], PositiveInt(g, p + "context_length"));
  // vocab: the key, else the token list, else the embedding's rows.
  int64_t vocab = 0;
  if (g.Find(p + "vocab_size") != nullptr) {
    ICE_ASSIGN_OR_RETURN(vocab, PositiveInt(g, p + "vocab_size"));
  } else if (const GgufValue* t = g.Find("tokenizer.ggml.tokens"); t != nullptr && t->type == GgufValueType::kArray) {
    vocab = static_cast<int64_t>(t->count);
  } else if (const GgufTensor* e = g.FindTensor("token_embd.weight"); e != nullptr && e->ne.size() == 2) {
    vocab = e->ne[1];
  }
  if (vocab <= 0)
    return InvalidArgumentError(g.source + ": cannot tell the vocabulary size (no " + p +
                                "vocab_size, tokenizer.ggml.tokens or token_embd.weight)");
  j["vocab_size"] = vocab;
  const int64_t default_head_dim = hidden % heads == 0 ? hidden / heads : 0;
  ICE_ASSIGN_OR_RETURN(int64_t head_dim, OptionalPositiveInt(g, p + "attention.key_length", default_head_dim));
  if (head_dim == 0)
    return InvalidArgumentError(g.source + ": " + p +
                                "embedding_length is not a multiple of the head count and there is no " + p +
                                "attention.key_length");
  ICE_ASSIGN_OR_RETURN(int64_t value_dim, OptionalPositiveInt(g, p + "attention.value_length", head_dim));
  if (value_dim != head_dim) {
    return InvalidArgumentError(g.source + ": attention.value_length " + std::to_string(value_dim) +
                                " differs from key_length " + std::to_string(head_dim) + " (not supported)");
  }
  ICE_ASSIGN_OR_RETURN(int64_t rope_dim, OptionalPositiveInt(g, p + "rope.dimension_count", head_dim));
  if (rope_dim != head_dim) {
    return InvalidArgumentError(g.source + ": " + p + "rope.dimension_count " + std::to_string(rope_dim) +
                                " differs from the head dimension " + std::to_string(head_dim) +
                                " (partial rotary is not supported)");
  }
  j["head_dim"] = head_dim;
  if (g.Find(p + "attention.layer_norm_rms_epsilon") != nullptr) {
    ICE_ASSIGN_OR_RETURN(j["rms_norm_eps"], g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  } else {
    return NotFoundError(g.source + ": metadata key '" + p + "attention.layer_norm_rms_epsilon' is missing");
  }
  if (g.Find(p + "rope.freq_base") != nullptr) {
    ICE_ASSIGN_OR_RETURN(j["rope_theta"], g.GetFloat(p + "rope.freq_base"));
  }
  if (g.Find(p + "rope.scaling.type") != nullptr) {
    ICE_ASSIGN_OR_RETURN(std::string type, g.GetString(p + "rope.scaling.type"));
    if (type == "linear") {
      ICE_ASSIGN_OR_RETURN(double factor, g.GetFloat(p + "rope.scaling.factor"));
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
    } else if (type != "none") {
      return InvalidArgumentError(g.source + ": " + p + "rope.scaling.type '" + type +
                                  "' is not supported (none, linear)");
    }
  }
  if (g.FindTensor("rope_freqs.weight") != nullptr) {
    return InvalidArgumentError(g.source +
                                ": tensor 'rope_freqs.weight' (Llama-3 rope scaling) is not supported in GGUF files");
  }
  j["tie_word_embeddings"] = g.FindTensor("output.weight") == nullptr;
  if (std::string(arch->gguf_name) == "llama") j["attention_bias"] = g.FindTensor("blk.0.attn_q.bias") != nullptr;
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                   std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"}}) {
    if (g.Find(key) == nullptr) continue;
    ICE_ASSIGN_OR_RETURN(int64_t id, g.GetInt(key));
    if (id < 0 || id >= vocab) {
      return InvalidArgumentError(g.source + ": metadata '" + key + "' = " + std::to_string(id) +
                                  " is outside the vocabulary");
    }
    j[field] = id;
  }
  if (const GgufValue* ft = g.Find("general.file_type"); ft != nullptr) {
    j["torch_dtype"] = "gguf file_type " + std::to_string(ft->i);
  }
  return ParseModelConfig(j.dump(), g.source);
}

StatusOr<std::unique_ptr<Checkpoint>> GgufCheckpoint(std::shared_ptr<const GgufFile> file, const ModelConfig& config,
                                                     const GgufLoadOptions& options) {
  const GgufContents& g = file->contents();
  ICE_ASSIGN_OR_RETURN(const ArchInfo* arch, FindArch(g));
  ICE_ASSIGN_OR_RETURN(const ShardPlan plan, PlanShard(config, options.tp_rank, options.tp_size));
  auto owner = std::make_shared<Owner>();
  owner->file = file;
  owner->buffers.reserve(g.tensors.size());
  std::vector<TensorInfo> infos;
  std::vector<const void*> data;
  std::vector<float> f32;
  for (const GgufTensor& t : g.tensors) {
    const std::string hf = HfName(t.name);
    if (hf.empty()) {
      return InvalidArgumentError(g.source + ": tensor '" + t.name +
                                  "' has no Hugging Face counterpart icecache knows");
    }
    if (t.ne.size() > 2) {
      return InvalidArgumentError(g.source + ": tensor '" + t.name + "' has " + std::to_string(t.ne.size()) +
                                  " dimensions (weights have 1 or 2)");
    }
    const bool is_q = hf.find("q_proj.") != std::string::npos, is_k = hf.find("k_proj.") != std::string::npos;
    const bool permute = arch->permuted_qk && (is_q || is_k);
    const bool plain = t.type == GgmlType::kF32 || t.type == GgmlType::kF16 || t.type == GgmlType::kBF16;
    const uint8_t* src = file->data(t);
    TensorInfo info;
    info.name = hf;
    info.shape = t.shape();
    const int64_t rows = t.ne.size() == 2 ? t.ne[1] : t.ne[0];
    std::vector<uint8_t> permuted;
    if (permute) {
      const int64_t heads = is_q ? config.num_heads : config.num_kv_heads, hd = config.head_dim;
      if (rows != heads * hd) {
        return InvalidArgumentError(g.source + ": tensor '" + t.name + "' has " + std::to_string(rows) +
                                    " rows, expected " + std::to_string(heads) + " heads x " + std::to_string(hd));
      }
      // GGUF row h*hd + 2i + j holds HF row h*hd + j*(hd/2) + i. Blocks never cross rows, so rows
      // move as raw bytes whatever the type.
      const size_t row_bytes = t.bytes / static_cast<size_t>(rows);
      permuted.resize(t.bytes);
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < hd / 2; ++i) {
          for (int64_t jj = 0; jj < 2; ++jj) {
            const int64_t from = h * hd + 2 * i + jj, to = h * hd + jj * (hd / 2) + i;
            std::memcpy(permuted.data() + to * row_bytes, src + from * row_bytes, row_bytes);
          }
        }
      }
      src = permuted.data();
    }
    const bool keepable = options.keep_blocks && options.tp_size == 1 && t.ne.size() == 2;
    const bool keep = keepable && kernels::IsBlockQuantized(BlockDType(t.type));
    // Q4_K as Q4_1 blocks (Q4KToQ4_1: fp16 rounding of each sub-block's scale and min), the 5- and
    // 6-bit types as Q8_0 blocks (AsQ8_0Blocks: Q5_0 exactly, the others one int8 rounding per
    // value; 1.06 bytes a value where the bf16 dequantisation takes 2), in a copy; a scale past
    // fp16's range leaves the matrix to the dequantisation below.
    const bool to_q8 = t.type == GgmlType::kQ5_0 || t.type == GgmlType::kQ5_1 || t.type == GgmlType::kQ5_K ||
                       t.type == GgmlType::kQ6_K;
    if (keepable && (t.type == GgmlType::kQ4_K || to_q8)) {
      const int64_t n = t.numel();
      const kernels::DType as = to_q8 ? kernels::DType::kQ8_0 : kernels::DType::kQ4_1;
      std::vector<uint8_t> out(kernels::DTypeBytes(as, static_cast<size_t>(n)));
      if (to_q8 ? AsQ8_0Blocks(t.type, src, n, out.data()) : Q4KToQ4_1(src, n, out.data())) {
        info.dtype = as;
        info.end = out.size();
        owner->buffers.push_back(std::move(out));
        infos.push_back(info);
        data.push_back(owner->buffers.back().data());
        continue;
      }
    }
    if (plain || keep) {
      info.dtype = plain ? PlainDType(t.type) : BlockDType(t.type);
      info.end = t.bytes;
      if (permute) {
        owner->buffers.push_back(std::move(permuted));
        src = owner->buffers.back().data();
      }
      infos.push_back(info);
      data.push_back(src);
      continue;
    }
    const int64_t n = t.numel();
    const RankSlice slice = options.tp_size > 1 && t.ne.size() == 2 ? SliceOf(hf, plan, config) : RankSlice{};
    if (slice.count > 0) {
      info.dtype = options.quantized_dtype;
      info.end = static_cast<uint64_t>(n) * kernels::DTypeSize(info.dtype);
      ICE_ASSIGN_OR_RETURN(std::shared_ptr<void> region, ZeroPages(info.end));
      uint8_t* out = static_cast<uint8_t*>(region.get());
      const size_t esz = kernels::DTypeSize(info.dtype);
      const int64_t cols = t.ne[0];
      const size_t row_bytes = t.bytes / static_cast<size_t>(rows);
      if (!slice.columns) {
        const int64_t count = slice.count * cols;
        f32.resize(static_cast<size_t>(count));
        DequantizeGgml(t.type, src + slice.first * row_bytes, count, f32.data());
        kernels::ConvertFromF32(info.dtype, f32.data(), out + slice.first * cols * esz, static_cast<size_t>(count));
      } else {
        const int64_t bv = GgmlBlockValues(t.type), bb = GgmlBlockBytes(t.type);
        const bool aligned = slice.first % bv == 0 && slice.count % bv == 0;
        f32.resize(static_cast<size_t>(aligned ? slice.count : cols));
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* row = src + r * row_bytes;
          if (aligned) {
            DequantizeGgml(t.type, row + slice.first / bv * bb, slice.count, f32.data());
          } else {
            DequantizeGgml(t.type, row, cols, f32.data());
          }
          kernels::ConvertFromF32(info.dtype, f32.data() + (aligned ? 0 : slice.first),
                                  out + (r * cols + slice.first) * esz, static_cast<size_t>(slice.count));
        }
      }
      owner->regions.push_back(std::move(region));
      infos.push_back(info);
      data.push_back(out);
      continue;
    }
    f32.resize(static_cast<size_t>(n));
    DequantizeGgml(t.type, src, n, f32.data());
    info.dtype = options.quantized_dtype;
    info.end = static_cast<uint64_t>(n) * kernels::DTypeSize(info.dtype);
    std::vector<uint8_t> out(info.end);
    kernels::ConvertFromF32(info.dtype, f32.data(), out.data(), static_cast<size_t>(n));
    owner->buffers.push_back(std::move(out));
    infos.push_back(info);
    data.push_back(owner->buffers.back().data());
  }
  f32 = {};
  return Checkpoint::FromTensors(g.source, std::move(infos), std::move(data), owner);
}

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> GgufTokenizer(const GgufContents& g) {
#if !ICECACHE_HAVE_TOKENIZER
  return UnimplementedError(g.source + ": this build of icecache has no tokenizer");
#else
  tokenizer::GgufVocab v;
  v.source = g.source;
  ICE_ASSIGN_OR_RETURN(v.model, g.GetString("tokenizer.ggml.model"));
  if (g.Find("tokenizer.ggml.pre")) {
    ICE_ASSIGN_OR_RETURN(v.pre, g.GetString("tokenizer.ggml.pre"));
  }
  ICE_ASSIGN_OR_RETURN(v.tokens, g.GetStringArray("tokenizer.ggml.tokens"));
  if (g.Find("tokenizer.ggml.token_type")) {
    ICE_ASSIGN_OR_RETURN(v.token_types, g.GetIntArray("tokenizer.ggml.token_type"));
  }
  if (g.Find("tokenizer.ggml.scores")) {
    ICE_ASSIGN_OR_RETURN(v.scores, g.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (g.Find("tokenizer.ggml.merges")) {
    ICE_ASSIGN_OR_RETURN(v.merges, g.GetStringArray("tokenizer.ggml.merges"));
  }
  for (auto [key, out] :
       {std::pair{"tokenizer.ggml.bos_token_id", &v.bos_id}, std::pair{"tokenizer.ggml.eos_token_id", &v.eos_id},
        std::pair{"tokenizer.ggml.unknown_token_id", &v.unk_id}}) {
    if (g.Find(key)) {
      ICE_ASSIGN_OR_RETURN(*out, g.GetInt(key));
    }
  }
  for (auto [key, out] :
       {std::pair{"tokenizer.ggml.add_bos_token", &v.add_bos}, std::pair{"tokenizer.ggml.add_eos_token", &v.add_eos},
        std::pair{"tokenizer.ggml.add_space_prefix", &v.add_space_prefix}}) {
    if (g.Find(key)) {
      ICE_ASSIGN_OR_RETURN(*out, g.GetBool(key));
    }
  }
  if (g.Find("tokenizer.chat_template")) {
    ICE_ASSIGN_OR_RETURN(v.chat_template, g.GetString("tokenizer.chat_template"));
  }
  return tokenizer::BuildGgufTokenizer(v);
#endif
}

StatusOr<GgufModelParts> LoadGgufModel(const std::string& path, const GgufLoadOptions& options) {
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  std::shared_ptr<const GgufFile> shared(std::move(file));
  GgufModelParts parts;
  ICE_ASSIGN_OR_RETURN(parts.config, GgufModelConfig(shared->contents()));
  ICE_ASSIGN_OR_RETURN(parts.checkpoint, GgufCheckpoint(shared, parts.config, options));
#if ICECACHE_HAVE_TOKENIZER
  if (shared->contents().Find("tokenizer.ggml.model") != nullptr) {
    ICE_ASSIGN_OR_RETURN(parts.tokenizer, GgufTokenizer(shared->contents()));
    if (parts.tokenizer->vocab_size() > parts.config.vocab_size) {
      return InvalidArgumentError(path + ": the tokenizer has " + std::to_string(parts.tokenizer->vocab_size()) +
                                  " ids but the model's vocabulary is " + std::to_string(parts.config.vocab_size));
    }
  }
#endif
  return parts;
}

StatusOr<bool> ResolveGgufPath(const std::string& path, std::string* gguf_path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0)
      return NotFoundError(path + ": no such file");
    return false;
  }
  if (S_ISREG(st.st_mode)) {
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) {
      *gguf_path = path;
      return true;
    }
    return false;
  }
  if (!S_ISDIR(st.st_mode) || ::stat((path + "/config.json").c_str(), &st) == 0) return false;
  ICE_ASSIGN_OR_RETURN(std::string found, FindGgufInDirectory(path));
  if (found.empty()) return false;
  *gguf_path = found;
  return true;
}

}  // namespace icecache::model
