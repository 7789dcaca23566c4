// Collectives on raw buffers, built from the communicator's point-to-point messages.
//
// Every call checks its arguments at once (ValueError naming the argument), queues the collective
// on the communicator's collective thread and returns a request. All ranks must call collectives
// in the same order; a rank that calls a different collective, or the same one with another
// dtype, op, size or root, makes the ranks that exchange a message with it fail with
// MismatchError. A failed collective aborts the communicator.
//
// Buffers must stay valid until the request completes. A send buffer may be one of the receive
// buffers (in place). Reductions: see reduce/reduce.h for per-element semantics; AVG sums and
// then divides once by the world size (integers truncate toward zero; bool is rejected).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/communicator.h"
#include "core/types.h"

namespace dicomm {

using Pointers = std::vector<uintptr_t>;
using Sizes = std::vector<size_t>;

// Root's `nbytes` at `buf` land in every rank's `buf`.
RequestPtr broadcast(Communicator& comm, void* buf, size_t nbytes, int root);
// In place: every rank's `buf` becomes op over all ranks' `buf`.
RequestPtr all_reduce(Communicator& comm, void* buf, size_t count, DataType dtype, ReduceOp op);
// In place at `root`; other ranks' buffers are left as they were.
RequestPtr reduce(Communicator& comm, void* buf, size_t count, DataType dtype, ReduceOp op,
                  int root);
// recv[r] receives rank r's `nbytes` at `send`.
RequestPtr all_gather(Communicator& comm, const void* send, size_t nbytes, const Pointers& recv);
// Like all_gather, delivered at `root` only; `recv` is empty on other ranks.
RequestPtr gather(Communicator& comm, const void* send, size_t nbytes, const Pointers& recv,
                  int root);
// `root`'s send[r] lands in rank r's `recv`; `send` is empty on other ranks.
RequestPtr scatter(Communicator& comm, const Pointers& send, void* recv, size_t nbytes, int root);
// send[r] holds `count` elements for rank r; `recv` gets op over all ranks' send[this rank].
RequestPtr reduce_scatter(Communicator& comm, const Pointers& send, void* recv, size_t count,
                          DataType dtype, ReduceOp op);
// send[r] (send_bytes[r]) goes to rank r; recv[r] (recv_bytes[r]) comes from rank r. A pair's
// sizes must agree: this rank's send_bytes[r] == rank r's recv_bytes[this rank].
RequestPtr all_to_all(Communicator& comm, const Pointers& send, const Sizes& send_bytes,
                      const Pointers& recv, const Sizes& recv_bytes);
// Completes once every rank has entered the barrier.
RequestPtr barrier(Communicator& comm);

}  // namespace dicomm
