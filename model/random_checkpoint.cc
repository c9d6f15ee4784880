#include "model/random_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <system_error>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::model {
namespace {

constexpr const char* kBos = "<|begin_of_text|>";
constexpr const char* kEos = "<|end_of_text|>";

class TensorMaker {
 public:
  TensorMaker(uint64_t seed, kernels::DType dtype) : rng_(seed), dtype_(dtype) {}

  void Normal(std::vector<TensorToWrite>* out, const std::string& name, std::vector<int64_t> shape, double std) {
    Fill(out, name, std::move(shape), [&] { return static_cast<float>(std::normal_distribution<double>(0.0, std)(rng_)); });
  }
  void Ones(std::vector<TensorToWrite>* out, const std::string& name, std::vector<int64_t> shape) {
    Fill(out, name, std::move(shape), [] { return 1.f; });
  }

 private:
  template <typename F>
  void Fill(std::vector<TensorToWrite>* out, const std::string& name, std::vector<int64_t> shape, F gen) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = gen();
    TensorToWrite t;
    t.name = name;
    t.dtype = dtype_;
    t.shape = std::move(shape);
    t.data.resize(static_cast<size_t>(n) * kernels::DTypeSize(dtype_));
    kernels::ConvertFromF32(dtype_, v.data(), t.data.data(), static_cast<size_t>(n));
    out->push_back(std::move(t));
  }
  std::mt19937_64 rng_;
  kernels::DType dtype_;
};

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return UnavailableError(path + ": cannot open for writing");
  out << text;
  out.close();
  if (!out) return UnavailableError(path + ": write failed");
  return Status::Ok();
}

}  // namespace

StatusOr<ModelConfig> RandomModelConfig(const RandomModelSpec& s) {
  if (s.hidden <= 0 || s.layers <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.vocab <= 2 || s.max_position <= 0) {
    return InvalidArgumentError("make-model: sizes must be positive (vocab > 2)");
  }
  if (s.heads % s.kv_heads != 0) return InvalidArgumentError("make-model: --heads must be a multiple of --kv-heads");
  ModelConfig c;
  c.arch = s.arch;
  c.hidden_size = s.hidden;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  if (s.head_dim > 0) {
    if (s.arch == Architecture::kQwen2 && s.head_dim * s.heads != s.hidden) {
      return InvalidArgumentError("make-model: qwen2 needs head_dim == hidden / heads");
    }
    c.head_dim = s.head_dim;
  } else {
    if (s.hidden % s.heads != 0) return InvalidArgumentError("make-model: --hidden must be a multiple of --heads");
    c.head_dim = s.hidden / s.heads;
  }
  if (c.head_dim % 2 != 0) return InvalidArgumentError("make-model: head_dim must be even");
  c.intermediate_size = s.intermediate > 0 ? s.intermediate : (s.hidden * 8 / 3 + 31) / 32 * 32;
  c.vocab_size = s.vocab;
  c.max_position = s.max_position;
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = s.tie;
  c.attention_bias = s.arch == Architecture::kQwen2;
  c.qk_norm = s.arch == Architecture::kQwen3;
  c.rope.theta = s.rope_theta;
  c.rope.rotary_dim = c.head_dim;
  // Special tokens take the last ids: bos, eos (then <|im_start|>, <|im_end|> with a chat template).
  const bool chat = s.chat_template && s.write_tokenizer;
  const int first_special = s.vocab - (chat ? 4 : 2);
  c.bos_ids = {first_special};
  c.eos_ids = {first_special + 1};
  if (chat) c.eos_ids.push_back(first_special + 3);  // <|im_end|> ends an assistant turn
  switch (s.dtype) {
    case kernels::DType::kBF16: c.torch_dtype = "bfloat16"; break;
    case kernels::DType::kF16: c.torch_dtype = "float16"; break;
    case kernels::DType::kF32: c.torch_dtype = "float32"; break;
    default: c.torch_dtype = std::string(kernels::DTypeName(s.dtype)); break;  // WriteRandomCheckpoint refuses it
  }
  return c;
}

Status WriteRandomCheckpoint(const std::string& dir, const RandomModelSpec& spec) {
  ICE_ASSIGN_OR_RETURN(ModelConfig c, RandomModelConfig(spec));
  if (kernels::IsBlockQuantized(spec.dtype)) {
    return InvalidArgumentError("random checkpoints are written in f32, f16 or bf16, not " +
                                std::string(kernels::DTypeName(spec.dtype)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError(dir + ": cannot create directory: " + ec.message());

  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t QD = c.num_heads * D, KD = c.num_kv_heads * D;
  const double w_std = 0.02, emb_std = 1.0 / std::sqrt(static_cast<double>(H));
  TensorMaker mk(spec.seed, spec.dtype);
  std::vector<TensorToWrite> t;
  mk.Normal(&t, "model.embed_tokens.weight", {V, H}, emb_std);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    mk.Ones(&t, p + "input_layernorm.weight", {H});
    mk.Normal(&t, p + "self_attn.q_proj.weight", {QD, H}, w_std);
    mk.Normal(&t, p + "self_attn.k_proj.weight", {KD, H}, w_std);
    mk.Normal(&t, p + "self_attn.v_proj.weight", {KD, H}, w_std);
    if (c.attention_bias) {
      mk.Normal(&t, p + "self_attn.q_proj.bias", {QD}, w_std);
      mk.Normal(&t, p + "self_attn.k_proj.bias", {KD}, w_std);
      mk.Normal(&t, p + "self_attn.v_proj.bias", {KD}, w_std);
    }
    if (c.qk_norm) {
      mk.Ones(&t, p + "self_attn.q_norm.weight", {D});
      mk.Ones(&t, p + "self_attn.k_norm.weight", {D});
    }
    mk.Normal(&t, p + "self_attn.o_proj.weight", {H, QD}, w_std);
    mk.Ones(&t, p + "post_attention_layernorm.weight", {H});
    mk.Normal(&t, p + "mlp.gate_proj.weight", {I, H}, w_std);
    mk.Normal(&t, p + "mlp.up_proj.weight", {I, H}, w_std);
    mk.Normal(&t, p + "mlp.down_proj.weight", {H, I}, w_std);
  }
  mk.Ones(&t, "model.norm.weight", {H});
  if (!c.tie_word_embeddings) mk.Normal(&t, "lm_head.weight", {V, H}, emb_std);

  ICE_RETURN_IF_ERROR(WriteText(dir + "/config.json", ModelConfigToJson(c)));
  ICE_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", t));
  if (!spec.write_tokenizer) return Status::Ok();
#if ICECACHE_HAVE_TOKENIZER
  tokenizer::ByteLevelBpeSpec ts;
  ts.special_tokens = {kBos, kEos};
  if (spec.chat_template) ts.special_tokens.insert(ts.special_tokens.end(), {"<|im_start|>", "<|im_end|>"});
  ts.vocab_size = spec.vocab - static_cast<int>(ts.special_tokens.size());
  ts.corpus =
      "The quick brown fox jumps over the lazy dog. A cache keeps the keys and values of every token; "
      "attention reads them back at each step of decoding. Long contexts need memory, and memory costs time. "
      "the of and to in is that for it as was with be by on not he this are or his from at which but have";
  ICE_ASSIGN_OR_RETURN(std::string tok_json, tokenizer::BuildByteLevelBpeTokenizerJson(ts));
  ICE_RETURN_IF_ERROR(WriteText(dir + "/tokenizer.json", tok_json));
  nlohmann::json tc = {{"bos_token", kBos}, {"eos_token", kEos}, {"add_bos_token", true},
                       {"model_max_length", spec.max_position}, {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (spec.chat_template) {
    tc["chat_template"] =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  }
  ICE_RETURN_IF_ERROR(WriteText(dir + "/tokenizer_config.json", tc.dump(2) + "\n"));
  return Status::Ok();
#else
  return UnimplementedError("make-model: this build has no tokenizer library; pass write_tokenizer=false");
#endif
}

Status EnsureRandomCheckpoint(const std::string& dir, const RandomModelSpec& spec) {
  if (std::filesystem::exists(dir + "/config.json")) return Status::Ok();
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  if (Status s = WriteRandomCheckpoint(tmp, spec); !s.ok()) {
    std::error_code ignored;
    std::filesystem::remove_all(tmp, ignored);
    return s;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dir, ec);
  if (!ec) return Status::Ok();
  std::error_code ignored;
  std::filesystem::remove_all(tmp, ignored);
  if (std::filesystem::exists(dir + "/config.json")) return Status::Ok();  // another process got there first
  return UnavailableError(dir + ": cannot move the written checkpoint into place: " + ec.message());
}

}  // namespace icecache::model
