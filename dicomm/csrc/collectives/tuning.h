// Size thresholds that pick algorithms, and the pipeline chunk size. Defaults suit shared memory
// and TCP on commodity hosts. Each communicator's configuration may change them (core/config.h),
// which lets tests cross every threshold with small buffers: DICOMM_COLL_CHUNK_BYTES sets the chunk
// size, DICOMM_COLL_SMALL_BYTES every small/large threshold at once.
#pragma once

#include <cstddef>

namespace dicomm {

struct EngineConfig;

struct Tuning {
  size_t chunk_bytes = 512 << 10;            // pipeline unit: big enough to amortise a message
  size_t recv_window = 4;                    // scratch chunks in flight per ring receive
  size_t all_reduce_ring_bytes = 256 << 10;  // below: recursive doubling
  size_t broadcast_chain_bytes = 256 << 10;  // below: binomial tree
  size_t reduce_ring_bytes = 256 << 10;      // below: binomial tree
  size_t all_gather_ring_bytes = 1 << 20;    // total bytes; below: direct exchange
  size_t reduce_scatter_ring_bytes = 256 << 10;  // per-rank bytes; below: direct exchange
  int all_reduce_direct_ranks = 0;  // large all_reduce: direct up to this many ranks, ring beyond
  bool all_reduce_push = true;      // large all_reduce on one host: the push algorithm where it can
  bool all_reduce_steal = false;    // the push algorithm: ranks done with their block take others' chunks
  bool all_reduce_fused = true;     // the push algorithm: one pass over a chunk's p inputs, not p - 1
  unsigned all_reduce_push_delay_ms = 0;  // testing: this rank waits so long before its first chunk

  static Tuning of(const EngineConfig& config);
};

// Steps available in a collective tag (collective_tag keeps 20 bits for the step).
constexpr size_t kMaxTagSteps = size_t{1} << 20;

}  // namespace dicomm
