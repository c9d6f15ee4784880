// Tokenizer::Load: tokenizer.json (+ tokenizer_config.json / generation_config.json beside it).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/tokenizer_json_reader.h"

namespace icecache::tokenizer {

using Json = nlohmann::json;

class TokenizerLoader {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  static StatusOr<std::unique_ptr<Tokenizer>> Build(Json doc, BpeData data, const Json& config,
                                                    const Json* generation_config, const std::string& source,
                                                    const std::string& config_source);

 private:
  static Status ParseTokenizerJson(const Json& j, BpeData data, TokenizerImpl* t);
  static Status ParseAddedTokens(const Json& j, TokenizerImpl* t);
  static Status ParsePostProcessor(const Json& j, TokenizerImpl* t);
  static Status ParseConfig(const Json& config, const Json* generation_config, TokenizerImpl* t);
};

namespace {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError(path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return InvalidArgumentError(path + ": read error");
  return ss.str();
}

StatusOr<Json> ParseJsonFile(const std::string& path, const std::string& text) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(path + ": invalid JSON: " + e.what());
  }
}

// A bos_token / eos_token entry of tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> TokenString(const Json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Status TokenizerLoader::ParseAddedTokens(const Json& j, TokenizerImpl* t) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_array()) return InvalidArgumentError("\"added_tokens\" is not an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& a = j[i];
    std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string()) {
      return InvalidArgumentError(where + ": needs an integer \"id\" and a string \"content\"");
    }
    AddedToken tok;
    int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id > (1 << 30)) return InvalidArgumentError(where + ": id out of range");
    tok.id = static_cast<int32_t>(id);
    tok.content = a["content"].get<std::string>();
    if (tok.content.empty()) return InvalidArgumentError(where + ": empty content");
    auto flag = [&](const char* key, bool fallback) {
      return a.contains(key) && a[key].is_boolean() ? a[key].get<bool>() : fallback;
    };
    tok.special = flag("special", false);
    tok.single_word = flag("single_word", false);
    tok.lstrip = flag("lstrip", false);
    tok.rstrip = flag("rstrip", false);
    tok.normalized = flag("normalized", !tok.special);
    if (t->added_by_id_.count(tok.id)) continue;
    t->added_by_id_[tok.id] = t->added_tokens_.size();
    t->added_by_content_.emplace(tok.content, tok.id);
    t->added_tokens_.push_back(tok);
  }
  for (const AddedToken& tok : t->added_tokens_) {
    if (tok.normalized && t->normalizer_) {
      t->normalized_matcher_.Add(t->normalizer_->Normalize(tok.content), tok);
    } else if (tok.normalized) {
      t->normalized_matcher_.Add(tok.content, tok);
    } else {
      t->raw_matcher_.Add(tok.content, tok);
    }
  }
  return Status::Ok();
}

Status TokenizerLoader::ParsePostProcessor(const Json& j, TokenizerImpl* t) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgumentError("post_processor: expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return InvalidArgumentError("post_processor Sequence: missing array \"processors\"");
    }
    for (const auto& p : j["processors"]) {
      if (p.is_object() && p.contains("type") && p["type"] == "Sequence") {
        return InvalidArgumentError("post_processor Sequence: nested Sequence is not supported");
      }
      ICE_RETURN_IF_ERROR(ParsePostProcessor(p, t));
    }
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) {
      return InvalidArgumentError("post_processor TemplateProcessing: missing array \"single\"");
    }
    const Json& specials = JsonField(j, "special_tokens");
    t->prefix_ids_.clear();
    t->suffix_ids_.clear();
    bool seen_sequence = false;
    for (const auto& item : j["single"]) {
      if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
          !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
        return InvalidArgumentError("post_processor TemplateProcessing: bad item in \"single\"");
      }
      std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].is_object() || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        return InvalidArgumentError("post_processor TemplateProcessing: special token \"" + name +
                                    "\" has no ids in \"special_tokens\"");
      }
      for (const auto& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) return InvalidArgumentError("post_processor TemplateProcessing: non-integer id");
        (seen_sequence ? t->suffix_ids_ : t->prefix_ids_).push_back(id.get<int32_t>());
      }
    }
    return Status::Ok();
  }
  return InvalidArgumentError("unsupported post_processor type \"" + type +
                              "\" (supported: ByteLevel, TemplateProcessing, Sequence)");
}

Status TokenizerLoader::ParseTokenizerJson(const Json& j, BpeData data, TokenizerImpl* t) {
  if (!j.is_object()) return InvalidArgumentError("top level is not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) return InvalidArgumentError("missing object \"model\"");
  const Json& model = j["model"];
  std::string type = model.contains("type") && model["type"].is_string() ? model["type"].get<std::string>() : "BPE";
  if (type != "BPE") {
    return InvalidArgumentError("unsupported model type \"" + type + "\" (only BPE is supported)");
  }
  auto bpe = BpeModel::Build(model, std::move(data));
  if (!bpe.ok()) return bpe.status();
  t->model_ = std::move(bpe).value();
  ICE_ASSIGN_OR_RETURN(t->normalizer_, ParseNormalizer(JsonField(j, "normalizer")));
  ICE_ASSIGN_OR_RETURN(t->pre_tokenizer_, ParsePreTokenizer(JsonField(j, "pre_tokenizer")));
  ICE_ASSIGN_OR_RETURN(t->decoder_, ParseDecoder(JsonField(j, "decoder")));
  ICE_RETURN_IF_ERROR(ParseAddedTokens(JsonField(j, "added_tokens"), t));
  ICE_RETURN_IF_ERROR(ParsePostProcessor(JsonField(j, "post_processor"), t));
  t->vocab_size_ = t->model_->size();
  for (const auto& a : t->added_tokens_) t->vocab_size_ = std::max(t->vocab_size_, a.id + 1);
  for (int32_t id : t->prefix_ids_) {
    if (id < 0 || id >= t->vocab_size_) return InvalidArgumentError("post_processor: id " + std::to_string(id) + " out of range");
  }
  for (int32_t id : t->suffix_ids_) {
    if (id < 0 || id >= t->vocab_size_) return InvalidArgumentError("post_processor: id " + std::to_string(id) + " out of range");
  }
  return Status::Ok();
}

Status TokenizerLoader::ParseConfig(const Json& config, const Json* generation_config, TokenizerImpl* t) {
  if (config.is_object()) {
    std::optional<std::string> bos_text, eos_text;
    if (auto bos = TokenString(config, "bos_token")) {
      bos_text = *bos;
      t->bos_id_ = t->TokenToId(*bos);
    }
    if (auto eos = TokenString(config, "eos_token")) {
      eos_text = *eos;
      if (auto id = t->TokenToId(*eos)) t->eos_ids_.push_back(*id);
    }
    // Without a TemplateProcessing post-processor, add_bos_token / add_eos_token decide.
    bool has_template = !t->prefix_ids_.empty() || !t->suffix_ids_.empty();
    if (!has_template) {
      if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean() &&
          config["add_bos_token"].get<bool>() && t->bos_id_) {
        t->prefix_ids_.push_back(*t->bos_id_);
      }
      if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean() &&
          config["add_eos_token"].get<bool>() && !t->eos_ids_.empty()) {
        t->suffix_ids_.push_back(t->eos_ids_[0]);
      }
    }
    std::string tmpl;
    if (config.contains("chat_template")) {
      const Json& ct = config["chat_template"];
      if (ct.is_string()) {
        tmpl = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const auto& e : ct) {
          if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
              e["template"].is_string()) {
            tmpl = e["template"].get<std::string>();
          }
        }
      }
    }
    t->chat_ = CompileChatTemplate(std::move(tmpl), std::move(bos_text), std::move(eos_text));
    if (!t->chat_.compile_status.ok()) {
      ICE_LOG(WARNING) << "the chat template does not compile; chat formatting will fail: "
                       << t->chat_.compile_status.message();
    }
  }
  if (generation_config && generation_config->is_object() && generation_config->contains("eos_token_id")) {
    const Json& e = (*generation_config)["eos_token_id"];
    auto add = [&](const Json& v) {
      if (v.is_number_integer()) {
        int32_t id = v.get<int32_t>();
        if (id >= 0 && id < t->vocab_size_) t->eos_ids_.push_back(id);
      }
    };
    if (e.is_array()) {
      for (const auto& v : e) add(v);
    } else {
      add(e);
    }
  }
  // The end-of-turn tokens the chat template writes end generation too.
  for (const std::string& tok : EndOfTurnTokens(t->chat_)) {
    if (auto id = t->TokenToId(tok)) t->eos_ids_.push_back(*id);
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Tokenizer>> TokenizerLoader::Load(const std::string& path_or_dir) {
  std::error_code dir_ec;
  const std::string path = std::filesystem::is_directory(path_or_dir, dir_ec)
                               ? (std::filesystem::path(path_or_dir) / "tokenizer.json").string()
                               : path_or_dir;
  ICE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Json j;
  BpeData data;
  Status read = ReadTokenizerJson(text, &j, &data);
  if (!read.ok()) return read.WithContext(path);
  text.clear();
  text.shrink_to_fit();

  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::string config_path = (dir / "tokenizer_config.json").string();
  std::string generation_path = (dir / "generation_config.json").string();
  Json config, generation;
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    ICE_ASSIGN_OR_RETURN(std::string ctext, ReadFile(config_path));
    ICE_ASSIGN_OR_RETURN(config, ParseJsonFile(config_path, ctext));
  }
  bool has_generation = std::filesystem::exists(generation_path, ec);
  if (has_generation) {
    ICE_ASSIGN_OR_RETURN(std::string gtext, ReadFile(generation_path));
    ICE_ASSIGN_OR_RETURN(generation, ParseJsonFile(generation_path, gtext));
  }
  return Build(std::move(j), std::move(data), config, has_generation ? &generation : nullptr, path, config_path);
}

StatusOr<std::unique_ptr<Tokenizer>> TokenizerLoader::Build(Json j, BpeData data, const Json& config,
                                                            const Json* generation_config, const std::string& source,
                                                            const std::string& config_source) {
  auto t = std::make_unique<TokenizerImpl>();
  try {
    Status s = ParseTokenizerJson(j, std::move(data), t.get());
    if (!s.ok()) return s.WithContext(source);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(source + ": unexpected JSON structure: " + e.what());
  }
  j = Json();
  try {
    Status s = ParseConfig(config, generation_config, t.get());
    if (!s.ok()) return s.WithContext(config_source);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(config_source + ": unexpected JSON structure: " + e.what());
  }
  if (!config.is_object()) {
    // No config: a single-token template prefix is the bos token.
    if (t->prefix_ids_.size() == 1) t->bos_id_ = t->prefix_ids_[0];
  }
  if (t->eos_ids_.empty()) {
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|im_end|>"}) {
      if (auto id = t->TokenToId(name)) {
        t->eos_ids_.push_back(*id);
        break;
      }
    }
  }
  std::sort(t->eos_ids_.begin(), t->eos_ids_.end());
  t->eos_ids_.erase(std::unique(t->eos_ids_.begin(), t->eos_ids_.end()), t->eos_ids_.end());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

StatusOr<std::unique_ptr<Tokenizer>> BuildTokenizer(nlohmann::json doc, BpeData data, const nlohmann::json& config,
                                                    const nlohmann::json* generation_config, const std::string& source,
                                                    const std::string& config_source) {
  return TokenizerLoader::Build(std::move(doc), std::move(data), config, generation_config, source, config_source);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) { return TokenizerLoader::Load(path); }

}  // namespace icecache::tokenizer
