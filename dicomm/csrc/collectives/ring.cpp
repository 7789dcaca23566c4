#include "collectives/ring.h"

#include <algorithm>

#include "collectives/partition.h"
#include "collectives/tuning.h"
#include "reduce/reduce.h"

namespace dicomm {

uint32_t ring_reduce(Session& s, const RingPlan& plan) {
  const int p = s.size(), r = s.rank();
  const size_t esize = dtype_size(plan.dtype);
  const Tuning& tuning = s.tuning();
  const size_t rs_steps = p - 1;
  const size_t steps = plan.all_gather ? 2 * rs_steps : rs_steps;
  const size_t max_count = *std::max_element(plan.count.begin(), plan.count.end());
  // Half the tag space at most, so callers can append steps of their own.
  const size_t nchunks = chunk_count(max_count * esize, tuning.chunk_bytes,
                                     kMaxTagSteps / (2 * steps));
  const size_t stride_bytes = Partition{max_count, nchunks}.max_length() * esize;
  const int next = (r + 1) % p, prev = (r + p - 1) % p;

  auto block_at = [&](size_t t) {  // block received at step t (sent at step t + 1); t < 2p
    return static_cast<int>((r + 2 * p - static_cast<int>(t) - 2) % p);
  };
  auto chunks_of = [&](int b) { return Partition{plan.count[b], nchunks}; };
  auto step_of = [&](size_t t, size_t k) { return static_cast<uint32_t>(t * nchunks + k); };

  // Partial sums of blocks without an `out` alternate between two buffers by step parity; a chunk
  // is overwritten two steps later, after the send that read it has completed.
  uint8_t* partial[2] = {nullptr, nullptr};
  for (int b = 0; b < p; ++b)
    if (plan.out[b] == nullptr && partial[0] == nullptr) {
      partial[0] = s.scratch(nchunks * stride_bytes);
      partial[1] = s.scratch(nchunks * stride_bytes);
    }

  // Reduce-scatter receives land in a small ring of scratch chunks, reused once reduced.
  const size_t rs_total = rs_steps * nchunks;
  const size_t window = std::min(std::max<size_t>(tuning.recv_window, 1), rs_total);
  uint8_t* slots = s.scratch(window * stride_bytes);
  std::vector<Transfer> recvs(steps * nchunks), sends(steps * nchunks);
  auto post_rs_recv = [&](size_t g) {
    const size_t t = g / nchunks, k = g % nchunks;
    const size_t len = chunks_of(block_at(t)).length(k);
    recvs[g] = s.recv(prev, slots + (g % window) * stride_bytes, len * esize, step_of(t, k));
  };
  for (size_t g = 0; g < window; ++g) post_rs_recv(g);
  // All-gather receives go straight to their final place: by the time a block's final value can
  // arrive, this rank's own sends of that block have been consumed.
  for (size_t t = rs_steps; t < steps; ++t) {
    const int b = block_at(t);
    const Partition part = chunks_of(b);
    for (size_t k = 0; k < nchunks; ++k)
      recvs[t * nchunks + k] = s.recv(prev, plan.out[b] + part.offset(k) * esize,
                                      part.length(k) * esize, step_of(t, k));
  }
  {
    const int b = (r + p - 1) % p;  // step 0 sends this rank's own contribution
    const Partition part = chunks_of(b);
    for (size_t k = 0; k < nchunks; ++k)
      sends[k] = s.send(next, plan.in[b] + part.offset(k) * esize, part.length(k) * esize,
                        step_of(0, k));
  }

  for (size_t t = 0; t < steps; ++t) {
    const int b = block_at(t);
    const Partition part = chunks_of(b);
    for (size_t k = 0; k < nchunks; ++k) {
      const size_t g = t * nchunks + k;
      const size_t offset = part.offset(k) * esize, len = part.length(k);
      s.wait(recvs[g]);
      uint8_t* result;
      if (t < rs_steps) {
        if (plan.out[b] != nullptr) {
          result = plan.out[b] + offset;
        } else {
          result = partial[t % 2] + k * stride_bytes;
          if (t >= 2) s.wait(sends[g - nchunks]);  // sent at step t - 1 from step t - 2's partial
        }
        reduction::combine(result, plan.in[b] + offset, slots + (g % window) * stride_bytes, len,
                           plan.dtype, plan.op);
        if (t == rs_steps - 1 && plan.op == ReduceOp::kAvg)
          reduction::divide(result, len, plan.dtype, p);
        if (g + window < rs_total) post_rs_recv(g + window);
      } else {
        result = plan.out[b] + offset;
      }
      if (t + 1 < steps) sends[g + nchunks] = s.send(next, result, len * esize, step_of(t + 1, k));
    }
  }
  return step_of(steps, 0);
}

}  // namespace dicomm
