#include "collectives/tuning.h"

#include "core/config.h"

namespace dicomm {

Tuning Tuning::of(const EngineConfig& config) {
  Tuning t;
  t.chunk_bytes = config.coll_chunk_bytes;
  t.all_reduce_direct_ranks = config.all_reduce_direct_ranks;
  t.all_reduce_push = config.all_reduce_push;
  t.all_reduce_steal = config.all_reduce_steal;
  t.all_reduce_fused = config.all_reduce_fused;
  t.all_reduce_push_delay_ms = config.all_reduce_push_delay_ms;
  if (const auto small = config.coll_small_bytes) {
    t.all_reduce_ring_bytes = t.broadcast_chain_bytes = t.reduce_ring_bytes = *small;
    t.all_gather_ring_bytes = t.reduce_scatter_ring_bytes = *small;
  }
  return t;
}

}  // namespace dicomm
