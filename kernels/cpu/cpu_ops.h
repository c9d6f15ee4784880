// Internal: CPU implementations of the kernels ops (OpenMP over rows/heads, AVX-512 where the
// compiler targets it). Arguments arrive already validated by kernels/ops.cc.
#pragma once

#include "kernels/op_table.h"

namespace icecache::kernels::cpu {

Status Matmul(const MatmulParams& p);
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

}  // namespace icecache::kernels::cpu
