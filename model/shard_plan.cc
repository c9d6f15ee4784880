#include "model/shard_plan.h"

#include <string>

namespace icecache::model {

StatusOr<ShardPlan> PlanShard(const ModelConfig& c, int rank, int size) {
  if (size < 1) return InvalidArgumentError("tensor_parallel_size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    return InvalidArgumentError("tensor-parallel rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(size) + ")");
  }
  const std::string tp = "tensor_parallel_size " + std::to_string(size);
  if (c.num_heads % size != 0) {
    return InvalidArgumentError(tp + " does not divide num_attention_heads " + std::to_string(c.num_heads));
  }
  if (c.num_kv_heads % size != 0 && size % c.num_kv_heads != 0) {
    return InvalidArgumentError(tp + " and num_key_value_heads " + std::to_string(c.num_kv_heads) +
                                " do not divide one another (kv heads are split when size divides them, "
                                "replicated when they divide size)");
  }
  if (c.intermediate_size % size != 0) {
    return InvalidArgumentError(tp + " does not divide intermediate_size " + std::to_string(c.intermediate_size));
  }
  ShardPlan p;
  p.rank = rank;
  p.size = size;
  p.q_heads = c.num_heads / size;
  p.q_head0 = rank * p.q_heads;
  if (c.num_kv_heads % size == 0) {
    p.kv_heads = c.num_kv_heads / size;
    p.kv_head0 = rank * p.kv_heads;
  } else {
    p.kv_heads = 1;
    p.kv_head0 = rank / (size / c.num_kv_heads);
  }
  p.inter = c.intermediate_size / size;
  p.inter0 = rank * p.inter;
  return p;
}

}  // namespace icecache::model
