// Reduce-scatter: for small blocks every rank sends each block straight to its owner, which
// reduces the p contributions in rank order; for large ones the ring of ring.h, where every rank
// reduces and forwards one block per step and the traffic per link is (p - 1) blocks.
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/launch.h"
#include "collectives/ring.h"
#include "collectives/tuning.h"
#include "reduce/reduce.h"

namespace dicomm {

void reduce_scatter_direct(Session& s, const Pointers& send, uint8_t* recv, size_t count,
                           DataType dtype, ReduceOp op) {
  const int p = s.size(), r = s.rank();
  const size_t bytes = count * dtype_size(dtype);
  std::vector<const uint8_t*> block(p);
  std::vector<Transfer> in;
  for (int i = 1; i < p; ++i) {
    const int j = (r + p - i) % p;
    uint8_t* tmp = s.scratch(bytes);
    block[j] = tmp;
    in.push_back(s.recv(j, tmp, bytes, 0));
  }
  for (int i = 1; i < p; ++i) {
    const int j = (r + i) % p;
    s.send(j, as_bytes(send[j]), bytes, 0);
  }
  // `recv` is written only after every send has been read, so it may overlap any send buffer.
  s.wait_all();
  block[r] = as_bytes(send[r]);
  // Rank order: recv = ((x0 op x1) op x2) ... The first combine writes recv, so this rank's own
  // block must be copied first if recv overlaps it, unless it is read by that very combine.
  if (overlaps(recv, bytes, block[r], bytes) && !(recv == block[r] && r < 2)) {
    uint8_t* own = s.scratch(bytes);
    std::memcpy(own, block[r], bytes);
    block[r] = own;
  }
  reduction::combine(recv, block[0], block[1], count, dtype, op);
  for (int j = 2; j < p; ++j) reduction::combine(recv, recv, block[j], count, dtype, op);
  if (op == ReduceOp::kAvg) reduction::divide(recv, count, dtype, p);
}

void reduce_scatter_ring(Session& s, const Pointers& send, uint8_t* recv, size_t count,
                         DataType dtype, ReduceOp op) {
  const int p = s.size(), r = s.rank();
  const size_t bytes = count * dtype_size(dtype);
  // `recv` may be send[r] itself (the ring reads send[r] only when writing recv), but must not
  // overlap anything else that is still to be sent; then the result goes through scratch.
  bool stage = false;
  for (int j = 0; j < p; ++j)
    if (overlaps(recv, bytes, as_ptr(send[j]), bytes) && !(j == r && as_bytes(send[j]) == recv))
      stage = true;
  uint8_t* out = stage ? s.scratch(bytes) : recv;
  RingPlan plan{dtype, op, std::vector<size_t>(p, count), {}, std::vector<uint8_t*>(p, nullptr),
                /*all_gather=*/false};
  for (int b = 0; b < p; ++b) plan.in.push_back(as_bytes(send[b]));
  plan.out[r] = out;
  ring_reduce(s, plan);
  if (stage) {
    s.wait_all();
    if (bytes) std::memcpy(recv, out, bytes);
  }
}

RequestPtr reduce_scatter(Communicator& comm, const Pointers& send, void* recv, size_t count,
                          DataType dtype, ReduceOp op) {
  const int p = comm.size();
  reduction::check_supported(dtype, op);
  check_length(send.size(), p, "send_ptrs", "one block per rank");
  const size_t bytes = count * dtype_size(dtype);
  for (uintptr_t ptr : send) check_buffer(ptr, bytes, "send_ptrs entry");
  check_buffer(reinterpret_cast<uintptr_t>(recv), bytes, "recv_ptr");
  Signature sig{CollectiveKind::kReduceScatter, dtype, op, count};
  auto* dst = static_cast<uint8_t*>(recv);
  const bool ring = bytes >= Tuning::of(comm.config()).reduce_scatter_ring_bytes;
  return launch(comm, sig, [=](Session& s) {
    if (p == 1) {
      if (bytes && as_bytes(send[0]) != dst) std::memmove(dst, as_ptr(send[0]), bytes);
      if (op == ReduceOp::kAvg) reduction::divide(dst, count, dtype, 1);
      return;
    }
    if (ring) reduce_scatter_ring(s, send, dst, count, dtype, op);
    else reduce_scatter_direct(s, send, dst, count, dtype, op);
  });
}

}  // namespace dicomm
