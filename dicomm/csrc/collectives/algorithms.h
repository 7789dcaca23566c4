// The algorithms behind the collectives, one family per file. Each runs inside a Session on the
// collective thread; the public entry points (collectives.h) check arguments and pick one by size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/collectives.h"
#include "collectives/session.h"

namespace dicomm {

// recursive_doubling.cpp: log2(p) full-size exchanges; non-powers of two fold extra ranks first.
void all_reduce_recursive_doubling(Session& s, uint8_t* buf, size_t count, DataType dtype,
                                   ReduceOp op);
// all_reduce.cpp: ring reduce-scatter chained into ring all-gather (ring.h).
void all_reduce_ring(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op);
// all_reduce_direct.cpp: every rank reduces its own block from every peer, then gathers the others'.
void all_reduce_direct(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op);
// all_reduce_push.cpp: on one host, every rank reduces its own block out of its peers' memory and
// writes it into theirs. False, having moved no data, where some rank cannot reach every peer's memory.
bool all_reduce_push(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op);

// tree.cpp: binomial trees rooted at `root`, for latency-bound sizes.
void broadcast_binomial(Session& s, uint8_t* buf, size_t nbytes, int root);
void reduce_binomial(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                     int root);

// broadcast.cpp, reduce.cpp: pipelined chain; ring reduce-scatter then gather to the root.
void broadcast_chain(Session& s, uint8_t* buf, size_t nbytes, int root);
void reduce_ring_gather(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                        int root);

// all_gather.cpp
void all_gather_direct(Session& s, const uint8_t* send, size_t nbytes, const Pointers& recv);
void all_gather_ring(Session& s, const uint8_t* send, size_t nbytes, const Pointers& recv);

// reduce_scatter.cpp
void reduce_scatter_direct(Session& s, const Pointers& send, uint8_t* recv, size_t count,
                           DataType dtype, ReduceOp op);
void reduce_scatter_ring(Session& s, const Pointers& send, uint8_t* recv, size_t count,
                         DataType dtype, ReduceOp op);

}  // namespace dicomm
