// What a model path describes, without its weights: the config and the tokenizer. For processes
// that tokenize but run no forward pass (the router). `path` is what Model::Load takes: a Hugging
// Face directory (config.json, tokenizer.json if present), a FILE.gguf, or a directory holding one
// GGUF file (config and tokenizer from its metadata; the file is parsed and validated, no tensor is
// read or dequantised).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "model/config.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::model {

struct ModelInfo {
  ModelConfig config;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null when the model has none
  std::string gguf_path;                            // the GGUF file, empty for a HF directory
};

// Errors as Model::Load gives them (naming the file and the problem).
StatusOr<ModelInfo> LoadModelInfo(const std::string& path);

}  // namespace icecache::model
