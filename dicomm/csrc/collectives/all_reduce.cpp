#include <vector>

#include "collectives/algorithms.h"
#include "collectives/launch.h"
#include "collectives/partition.h"
#include "collectives/ring.h"
#include "collectives/tuning.h"
#include "reduce/reduce.h"

namespace dicomm {

void all_reduce_ring(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op) {
  const int p = s.size();
  const size_t esize = dtype_size(dtype);
  const Partition blocks{count, static_cast<size_t>(p)};
  RingPlan plan{dtype, op, {}, {}, {}, /*all_gather=*/true};
  for (int b = 0; b < p; ++b) {
    plan.count.push_back(blocks.length(b));
    plan.in.push_back(buf + blocks.offset(b) * esize);
    plan.out.push_back(buf + blocks.offset(b) * esize);  // in place: partials overwrite the input
  }
  ring_reduce(s, plan);
}

RequestPtr all_reduce(Communicator& comm, void* buf, size_t count, DataType dtype, ReduceOp op) {
  reduction::check_supported(dtype, op);
  check_buffer(reinterpret_cast<uintptr_t>(buf), count, "buf");
  Signature sig{CollectiveKind::kAllReduce, dtype, op, count};
  auto* data = static_cast<uint8_t*>(buf);
  const Tuning tuning = Tuning::of(comm.config());
  const bool large = count * dtype_size(dtype) >= tuning.all_reduce_ring_bytes &&
                     count >= static_cast<size_t>(comm.size());
  const bool direct = comm.size() <= tuning.all_reduce_direct_ranks;
  const bool push = tuning.all_reduce_push;
  return launch(comm, sig, [=](Session& s) {
    if (s.size() == 1) return;  // AVG over one rank divides by one
    if (large && push && all_reduce_push(s, data, count, dtype, op)) return;
    if (large && direct) all_reduce_direct(s, data, count, dtype, op);
    else if (large) all_reduce_ring(s, data, count, dtype, op);
    else all_reduce_recursive_doubling(s, data, count, dtype, op);
  });
}

}  // namespace dicomm
