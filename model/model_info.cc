#include "model/model_info.h"

#include <filesystem>

#include "model/gguf.h"
#include "model/gguf_model.h"

namespace icecache::model {

StatusOr<ModelInfo> LoadModelInfo(const std::string& path) {
  ModelInfo info;
  ICE_ASSIGN_OR_RETURN(bool is_gguf, ResolveGgufPath(path, &info.gguf_path));
  if (is_gguf) {
    ICE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(info.gguf_path));
    ICE_ASSIGN_OR_RETURN(info.config, GgufModelConfig(file->contents()));
#if ICECACHE_HAVE_TOKENIZER
    if (file->contents().Find("tokenizer.ggml.model") != nullptr) {
      ICE_ASSIGN_OR_RETURN(info.tokenizer, GgufTokenizer(file->contents()));
    }
#endif
    return info;
  }
  ICE_ASSIGN_OR_RETURN(info.config, LoadModelConfig(path + "/config.json"));
#if ICECACHE_HAVE_TOKENIZER
  const std::string tok_path = path + "/tokenizer.json";
  std::error_code ec;
  if (std::filesystem::exists(tok_path, ec)) {
    ICE_ASSIGN_OR_RETURN(info.tokenizer, tokenizer::Tokenizer::Load(tok_path));
    if (info.tokenizer->vocab_size() > info.config.vocab_size) {
      return InvalidArgumentError(tok_path + ": tokenizer has " + std::to_string(info.tokenizer->vocab_size()) +
                                  " ids but config.json vocab_size is " + std::to_string(info.config.vocab_size));
    }
  }
#endif
  return info;
}

}  // namespace icecache::model
