// Ring reduce-scatter, optionally chained into a ring all-gather (together: the bandwidth-optimal
// all_reduce of large buffers), pipelined chunk by chunk.
//
// The vector is cut into size() blocks. At step t a rank sends block (rank - t - 1) to the next
// rank and receives block (rank - t - 2) from the previous one; after size() - 1 steps it owns
// block `rank` fully reduced, and size() - 1 all-gather steps hand every owned block around the
// ring. Each chunk moves on as soon as it is reduced, so later chunks overlap earlier ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/session.h"
#include "core/types.h"

namespace dicomm {

struct RingPlan {
  DataType dtype;
  ReduceOp op;                      // kAvg divides the owned block by size() once reduced
  std::vector<size_t> count;        // elements per block
  std::vector<const uint8_t*> in;   // this rank's contribution to each block
  std::vector<uint8_t*> out;        // each block's result; nullptr: partial sums go to scratch
                                    // (out[rank] is required; all of them for all_gather)
  bool all_gather = false;
};

// Runs the ring; returns the first tag step it left unused.
uint32_t ring_reduce(Session& s, const RingPlan& plan);

}  // namespace dicomm
