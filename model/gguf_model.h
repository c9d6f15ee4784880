// A Llama-family model read from a GGUF file, presented as what Model::Load reads from a Hugging
// Face directory: a ModelConfig, a Checkpoint holding the weights under their Hugging Face names
// and layout, and (model/tokenizer/gguf_vocab.h) the tokenizer.
//
// Architectures (general.architecture): "llama" (LlamaForCausalLM), "qwen2", "qwen3". The config
// comes from the "<arch>.*" keys (block_count, embedding_length, feed_forward_length,
// attention.head_count[_kv], attention.key_length, attention.layer_norm_rms_epsilon,
// context_length, rope.freq_base, rope.dimension_count, rope.scaling.type/factor "linear") and is
// validated as a config.json would be; tie_word_embeddings = there is no output.weight.
//
// Weights: GGUF names map to Hugging Face names (token_embd -> model.embed_tokens, blk.N.attn_q ->
// model.layers.N.self_attn.q_proj, ffn_gate -> mlp.gate_proj, attn_norm -> input_layernorm,
// ffn_norm -> post_attention_layernorm, output_norm -> model.norm, output -> lm_head, ...). An
// unknown tensor name is refused. F32, F16 and BF16 tensors are served straight from the mapping;
// with GgufLoadOptions::keep_blocks so are the Q8_0, Q4_0 and Q4_1 matrices (the kernels' block
// types, kernels/dtype.h: Matmul multiplies them in their blocks), and Q4_K matrices become Q4_1
// blocks in a copy (model/gguf_dequant.h, Q4KToQ4_1: fp16 rounding of each 32-value sub-block's
// scale and min, no rounding of the values), Q5_0 / Q5_1 / Q5_K / Q6_K matrices Q8_0 blocks
// (AsQ8_0Blocks: Q5_0 exactly, the others each value rounded to its 32-value block's int8
// steps). Other quantised tensors are dequantised at load into `quantized_dtype` (bf16 by
// default: each weight is the format's exact fp32 value rounded to nearest-even bf16, relative
// error <= 2^-9).
// For "llama", q_proj and k_proj rows are un-permuted: the converter stored them as
// W.reshape(n_head, 2, head_dim / 2, in).swapaxes(1, 2) (rotary pairs interleaved); Qwen2/3
// files are stored unpermuted.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/dtype.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::model {

struct GgufLoadOptions {
  kernels::DType quantized_dtype = kernels::DType::kBF16;  // kBF16, kF16 or kF32
  // Q8_0, Q4_0 and Q4_1 matrices keep their blocks (kernels::DType kQ8_0/kQ4_0/kQ4_1; q/k rows
  // un-permuted into a copy, everything else served from the mapping); Q4_K matrices become Q4_1
  // blocks, Q5_0 / Q5_1 / Q5_K / Q6_K Q8_0 blocks (copies). Ignored under tensor parallelism
  // (tp_size > 1), whose slices are dequantised.
  bool keep_blocks = false;
  // Tensor parallelism (model/shard_plan.h): with tp_size > 1 the quantised tensors a rank slices
  // (q/k/v_proj, gate/up_proj: its rows; o_proj, down_proj: its columns) are dequantised only in
  // rank tp_rank's part. They keep their full shape, in a lazily zeroed buffer whose other rows or
  // columns are never written (so they cost no memory and read as 0): only Model::Load of that
  // rank may use such a checkpoint. A row-parallel slice whose columns do not start and end on
  // the format's block boundaries dequantises whole rows and keeps its columns. Errors of
  // PlanShard for counts that do not divide.
  int tp_rank = 0;
  int tp_size = 1;
};

// The ModelConfig of a parsed GGUF file. Errors start with the file name.
StatusOr<ModelConfig> GgufModelConfig(const GgufContents& gguf);

// The weights of `file` under Hugging Face names (REQUIRES: config from GgufModelConfig of the
// same file). The checkpoint keeps `file` alive. INVALID_ARGUMENT naming the tensor for unknown
// names or shapes that do not fit the config.
StatusOr<std::unique_ptr<Checkpoint>> GgufCheckpoint(std::shared_ptr<const GgufFile> file, const ModelConfig& config,
                                                     const GgufLoadOptions& options = {});

// Everything Model::Load needs from a GGUF file. tokenizer is null when the file has no
// tokenizer.ggml.model (or icecache is built without its tokenizer).
struct GgufModelParts {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};
// The tokenizer described by the file's tokenizer.ggml.* metadata (model/tokenizer/gguf_vocab.h).
// NOT_FOUND without tokenizer.ggml.model; UNIMPLEMENTED in a build without the tokenizer.
StatusOr<std::unique_ptr<tokenizer::Tokenizer>> GgufTokenizer(const GgufContents& gguf);

StatusOr<GgufModelParts> LoadGgufModel(const std::string& path, const GgufLoadOptions& options = {});

// True when `path` names a GGUF model for Model::Load: a file ending in ".gguf", or a directory
// without config.json that holds exactly one *.gguf file (then *gguf_path is that file).
// INVALID_ARGUMENT when such a directory holds several.
StatusOr<bool> ResolveGgufPath(const std::string& path, std::string* gguf_path);

}  // namespace icecache::model
