// Which part of a model one tensor-parallel rank holds (Megatron-style, docs/parallel.md).
//
// q heads split evenly: rank r holds q heads [q_head0, q_head0 + q_heads), q_heads =
// num_heads / size. kv heads either split (num_kv_heads % size == 0: kv_heads = num_kv_heads /
// size) or, when there are fewer kv heads than ranks (size % num_kv_heads == 0), are replicated:
// each rank holds the one kv head its q heads read (size / num_kv_heads ranks share it). The MLP
// intermediate dimension splits evenly: [inter0, inter0 + inter).
#pragma once

#include "common/status.h"
#include "model/config.h"

namespace icecache::model {

struct ShardPlan {
  int rank = 0;
  int size = 1;
  int q_head0 = 0, q_heads = 0;    // local q heads
  int kv_head0 = 0, kv_heads = 0;  // local kv heads (q head h reads kv head h / (num_heads / num_kv_heads))
  int inter0 = 0, inter = 0;       // local MLP intermediate columns
};

// INVALID_ARGUMENT naming the counts when size < 1, rank outside [0, size), num_heads or
// intermediate_size not divisible by size, or num_kv_heads neither divisible by size nor
// dividing it.
StatusOr<ShardPlan> PlanShard(const ModelConfig& config, int rank, int size);

}  // namespace icecache::model
