// Reduce: binomial tree for small buffers; for large ones a ring reduce-scatter (every rank
// reduces 1/p of the data, in parallel) followed by each rank sending its reduced block to the
// root. Non-root buffers are inputs only.
#include "collectives/algorithms.h"
#include "collectives/launch.h"
#include "collectives/partition.h"
#include "collectives/ring.h"
#include "collectives/tuning.h"
#include "reduce/reduce.h"

namespace dicomm {

void reduce_ring_gather(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                        int root) {
  const int p = s.size(), r = s.rank();
  const size_t esize = dtype_size(dtype);
  const Partition blocks{count, static_cast<size_t>(p)};
  RingPlan plan{dtype, op, {}, {}, {}, /*all_gather=*/false};
  for (int b = 0; b < p; ++b) {
    plan.count.push_back(blocks.length(b));
    plan.in.push_back(buf + blocks.offset(b) * esize);
    // The root's buffer is its output, so its partials may overwrite it; others use scratch.
    plan.out.push_back(r == root ? buf + blocks.offset(b) * esize : nullptr);
  }
  if (r != root) plan.out[r] = s.scratch(blocks.length(r) * esize);
  const uint32_t step = ring_reduce(s, plan);
  if (r != root) {
    s.send(root, plan.out[r], blocks.length(r) * esize, step);
    return;
  }
  // Safe to receive into the root's buffer now: its own sends of these blocks were consumed
  // before the blocks could be fully reduced elsewhere.
  for (int b = 0; b < p; ++b)
    if (b != root) s.recv(b, buf + blocks.offset(b) * esize, blocks.length(b) * esize, step);
}

RequestPtr reduce(Communicator& comm, void* buf, size_t count, DataType dtype, ReduceOp op,
                  int root) {
  check_root(comm, root);
  reduction::check_supported(dtype, op);
  check_buffer(reinterpret_cast<uintptr_t>(buf), count, "buf");
  Signature sig{CollectiveKind::kReduce, dtype, op, count, root};
  auto* data = static_cast<uint8_t*>(buf);
  const bool ring = count * dtype_size(dtype) >= Tuning::of(comm.config()).reduce_ring_bytes &&
                    count >= static_cast<size_t>(comm.size());
  return launch(comm, sig, [=](Session& s) {
    if (s.size() == 1) return;
    if (ring) reduce_ring_gather(s, data, count, dtype, op, root);
    else reduce_binomial(s, data, count, dtype, op, root);
  });
}

}  // namespace dicomm
