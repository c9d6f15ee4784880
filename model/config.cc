#include "model/config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace icecache::model {
namespace {

using Json = nlohmann::json;

constexpr const char* kSupported =
    "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

std::string Where(std::string_view source) { return std::string(source); }

StatusOr<int> GetInt(const Json& j, const char* key, std::string_view source, bool required, int fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgumentError(Where(source) + ": missing required field '" + key + "'");
    return fallback;
  }
  if (!it->is_number_integer()) {
    return InvalidArgumentError(Where(source) + ": field '" + key + "' must be an integer");
  }
  int64_t v = it->get<int64_t>();
  if (v <= 0 || v > (int64_t{1} << 30)) {
    return InvalidArgumentError(Where(source) + ": field '" + key + "' = " + std::to_string(v) +
                                " is out of range (must be in [1, 2^30])");
  }
  return static_cast<int>(v);
}

StatusOr<double> GetNumber(const Json& j, const char* key, std::string_view source, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return InvalidArgumentError(Where(source) + ": field '" + key + "' must be a number");
  return it->get<double>();
}

StatusOr<bool> GetBool(const Json& j, const char* key, std::string_view source, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return InvalidArgumentError(Where(source) + ": field '" + key + "' must be true or false");
  return it->get<bool>();
}

StatusOr<std::vector<int32_t>> GetIds(const Json& j, const char* key, std::string_view source) {
  std::vector<int32_t> ids;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ids;
  auto one = [&](const Json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return InvalidArgumentError(Where(source) + ": field '" + key + "' must be a non-negative integer or a list of them");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return Status::Ok();
  };
  if (it->is_array()) {
    for (const auto& v : *it) ICE_RETURN_IF_ERROR(one(v));
  } else {
    ICE_RETURN_IF_ERROR(one(*it));
  }
  return ids;
}

Status ParseRopeScaling(const Json& j, std::string_view source, ModelConfig* c) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return InvalidArgumentError(Where(source) + ": 'rope_scaling' must be an object or null");
  const Json& rs = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = rs.find(key);
    if (t != rs.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  const std::string where = Where(source) + ": rope_scaling";
  if (type.empty()) return InvalidArgumentError(where + " has no 'rope_type'");
  if (type == "default") return Status::Ok();
  ICE_ASSIGN_OR_RETURN(double factor, GetNumber(rs, "factor", source, 0.0));
  if (type == "linear" || type == "llama3") {
    if (!(factor > 0.0)) return InvalidArgumentError(where + ": 'factor' must be a positive number");
    c->rope.factor = factor;
  }
  if (type == "linear") {
    c->rope.scaling = kernels::RopeScaling::kLinear;
    return Status::Ok();
  }
  if (type == "llama3") {
    c->rope.scaling = kernels::RopeScaling::kLlama3;
    ICE_ASSIGN_OR_RETURN(c->rope.low_freq_factor, GetNumber(rs, "low_freq_factor", source, 1.0));
    ICE_ASSIGN_OR_RETURN(c->rope.high_freq_factor, GetNumber(rs, "high_freq_factor", source, 4.0));
    ICE_ASSIGN_OR_RETURN(c->rope.original_max_position,
                         GetInt(rs, "original_max_position_embeddings", source, false, 8192));
    if (!(c->rope.high_freq_factor > c->rope.low_freq_factor)) {
      return InvalidArgumentError(where + ": 'high_freq_factor' must exceed 'low_freq_factor'");
    }
    return Status::Ok();
  }
  return InvalidArgumentError(where + " type '" + type +
                              "' is not supported (supported: none/default, linear, llama3)");
}

}  // namespace

std::string_view ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama: return "LlamaForCausalLM";
    case Architecture::kMistral: return "MistralForCausalLM";
    case Architecture::kQwen2: return "Qwen2ForCausalLM";
    case Architecture::kQwen3: return "Qwen3ForCausalLM";
  }
  return "unknown";
}

StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const std::exception& e) {
    return InvalidArgumentError(Where(source) + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(Where(source) + ": top level must be a JSON object");

  ModelConfig c;
  auto archs = j.find("architectures");
  std::string arch_name;
  if (archs != j.end() && archs->is_array() && archs->size() == 1 && (*archs)[0].is_string()) {
    arch_name = (*archs)[0].get<std::string>();
  } else if (archs != j.end()) {
    return InvalidArgumentError(Where(source) + ": 'architectures' must be a list with one class name (" + kSupported + ")");
  } else {
    return InvalidArgumentError(Where(source) + ": missing 'architectures' (" + kSupported + ")");
  }
  if (arch_name == "LlamaForCausalLM") {
    c.arch = Architecture::kLlama;
  } else if (arch_name == "MistralForCausalLM") {
    c.arch = Architecture::kMistral;
  } else if (arch_name == "Qwen2ForCausalLM") {
    c.arch = Architecture::kQwen2;
  } else if (arch_name == "Qwen3ForCausalLM") {
    c.arch = Architecture::kQwen3;
  } else {
    return InvalidArgumentError(Where(source) + ": architecture '" + arch_name + "' is not supported (" + kSupported + ")");
  }

  ICE_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", source, true, 0));
  ICE_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", source, true, 0));
  ICE_ASSIGN_OR_RETURN(c.num_layers, GetInt(j, "num_hidden_layers", source, true, 0));
  ICE_ASSIGN_OR_RETURN(c.num_heads, GetInt(j, "num_attention_heads", source, true, 0));
  ICE_ASSIGN_OR_RETURN(c.num_kv_heads, GetInt(j, "num_key_value_heads", source, false, c.num_heads));
  ICE_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", source, true, 0));
  ICE_ASSIGN_OR_RETURN(c.max_position, GetInt(j, "max_position_embeddings", source, false, 4096));
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgumentError(Where(source) + ": num_attention_heads (" + std::to_string(c.num_heads) +
                                ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");
  }
  auto hd = j.find("head_dim");
  const bool has_head_dim = hd != j.end() && !hd->is_null() && c.arch != Architecture::kQwen2;  // Qwen2 ignores it
  if (has_head_dim) {
    ICE_ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", source, true, 0));
  } else if (c.arch == Architecture::kQwen3) {
    c.head_dim = 128;  // Qwen3Config's default
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return InvalidArgumentError(Where(source) + ": hidden_size must be a multiple of num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) {
    return InvalidArgumentError(Where(source) + ": head_dim " + std::to_string(c.head_dim) + " must be even");
  }

  std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") {
    return InvalidArgumentError(Where(source) + ": hidden_act '" + act + "' is not supported (supported: silu)");
  }
  ICE_ASSIGN_OR_RETURN(bool mlp_bias, GetBool(j, "mlp_bias", source, false));
  if (mlp_bias) return InvalidArgumentError(Where(source) + ": mlp_bias=true is not supported");
  ICE_ASSIGN_OR_RETURN(double eps, GetNumber(j, "rms_norm_eps", source, 1e-6));
  if (!(eps > 0.0 && eps < 1.0)) return InvalidArgumentError(Where(source) + ": rms_norm_eps must be in (0, 1)");
  c.rms_norm_eps = static_cast<float>(eps);
  ICE_ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", source, false));
  ICE_ASSIGN_OR_RETURN(bool attention_bias, GetBool(j, "attention_bias", source, false));
  c.attention_bias = c.arch == Architecture::kQwen2 ? true : attention_bias;
  c.qk_norm = c.arch == Architecture::kQwen3;

  // Sliding-window attention is refused unless it can never take effect.
  ICE_ASSIGN_OR_RETURN(bool use_sliding, GetBool(j, "use_sliding_window", source, false));
  auto sw = j.find("sliding_window");
  bool sliding_applies = false;
  if (c.arch == Architecture::kMistral) {
    sliding_applies = sw != j.end() && !sw->is_null() &&
                      !(sw->is_number_integer() && sw->get<int64_t>() >= c.max_position);
  } else if (c.arch == Architecture::kQwen2 || c.arch == Architecture::kQwen3) {
    sliding_applies = use_sliding;
  }
  if (sliding_applies) {
    return InvalidArgumentError(Where(source) +
                                ": sliding-window attention is not supported (set sliding_window to null or "
                                "use_sliding_window to false; only full causal attention is implemented)");
  }

  ICE_ASSIGN_OR_RETURN(c.rope.theta, GetNumber(j, "rope_theta", source, 10000.0));
  if (!(c.rope.theta > 1.0)) return InvalidArgumentError(Where(source) + ": rope_theta must be > 1");
  c.rope.rotary_dim = c.head_dim;
  ICE_RETURN_IF_ERROR(ParseRopeScaling(j, source, &c));
  ICE_ASSIGN_OR_RETURN(c.bos_ids, GetIds(j, "bos_token_id", source));
  ICE_ASSIGN_OR_RETURN(c.eos_ids, GetIds(j, "eos_token_id", source));
  auto dt = j.find("torch_dtype");
  if (dt != j.end() && dt->is_string()) c.torch_dtype = dt->get<std::string>();
  return c;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open model config (is this a Hugging Face model directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path);
}

std::string ModelConfigToJson(const ModelConfig& c) {
  Json j;
  j["architectures"] = {std::string(ArchitectureName(c.arch))};
  switch (c.arch) {
    case Architecture::kLlama: j["model_type"] = "llama"; break;
    case Architecture::kMistral: j["model_type"] = "mistral"; j["sliding_window"] = nullptr; break;
    case Architecture::kQwen2: j["model_type"] = "qwen2"; j["use_sliding_window"] = false; break;
    case Architecture::kQwen3: j["model_type"] = "qwen3"; j["use_sliding_window"] = false; break;
  }
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  if (c.arch != Architecture::kQwen2) j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope.theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.arch == Architecture::kLlama || c.arch == Architecture::kQwen3) j["attention_bias"] = c.attention_bias;
  switch (c.rope.scaling) {
    case kernels::RopeScaling::kNone: j["rope_scaling"] = nullptr; break;
    case kernels::RopeScaling::kLinear: j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}}; break;
    case kernels::RopeScaling::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope.factor},
                           {"low_freq_factor", c.rope.low_freq_factor},
                           {"high_freq_factor", c.rope.high_freq_factor},
                           {"original_max_position_embeddings", c.rope.original_max_position}};
      break;
  }
  auto ids = [](const std::vector<int32_t>& v) -> Json {
    if (v.empty()) return nullptr;
    if (v.size() == 1) return v[0];
    return v;
  };
  j["bos_token_id"] = ids(c.bos_ids);
  j["eos_token_id"] = ids(c.eos_ids);
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace icecache::model
