// Internal: the CUDA backend. Only kernels/registry.cc (which knows CUDA is compiled in) and the
// files of this folder include this header. Every op receives device pointers, already validated
// by kernels/ops.cc, and runs on the calling thread's default per-thread stream; ops that return
// data to the host (Embedding's range check, TopLogits) synchronize.
#pragma once

#include <string>

#include "kernels/op_table.h"

namespace icecache::kernels::cuda {

const OpTable& CudaOpTable();

// Sets *usable and returns why it is not usable ("" when it is). cudaGetDeviceCount failing with
// cudaErrorInsufficientDriver (35) or cudaErrorNoDevice means "no device", not an error.
std::string ProbeDevice(bool* usable);

Status Matmul(const MatmulParams& p);
// One Matmul after another on the stream (kernels/matmul.h: the CPU fuses them into one loop).
Status MatmulGroup(const MatmulParams* products, int count);
Status RmsNorm(const RmsNormParams& p);
Status ApplyRope(const RopeParams& p);
Status SwiGlu(const SwiGluParams& p);
Status Add(const AddParams& p);
Status Embedding(const EmbeddingParams& p);
Status PrefillAttention(const PrefillAttentionParams& p);
Status PagedDecodeAttention(const PagedDecodeAttentionParams& p);
Status StoreKv(const StoreKvParams& p);
Status GatherKv(const GatherKvParams& p);
Status MergeToken(const MergeTokenParams& p);
Status MergeStates(const MergeStatesParams& p);
Status Argmax(const ArgmaxParams& p);
Status RepetitionPenalty(const RepetitionPenaltyParams& p);
Status CountPenalty(const CountPenaltyParams& p);
Status LogSumExp(const float* logits, int vocab, float* host_out);
Status TopLogits(const float* logits, int vocab, int count, float* sorted_logits,
                 int32_t* sorted_ids);

}  // namespace icecache::kernels::cuda
