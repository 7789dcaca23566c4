// Direct all_reduce: a reduce-scatter in which every rank pulls its own block's chunks straight
// from each peer and reduces them, chained into an all-gather in which every rank pulls each
// owner's reduced chunks into place. Over shared memory with cross-memory attach the receiver
// copies out of the sender's buffer, so each byte crosses memory as often as the bound of
// algorithms that pull their results (docs/benchmarks.md) allows: foreign chunks land in
// cache-sized scratch and are summed there, the owner writes its result once, the others copy it
// once. There are two dependent stages instead of the ring's 2(p - 1), and the data a rank
// contributes is read by its peers whether it runs or not. Not the default: on a 2-core host it
// was no faster than the ring (docs/architecture.md).
//
// Every element is reduced in rank order (x0 op x1 op ... op x(p-1)), so every rank holds the
// same bits whatever the operation.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/partition.h"
#include "collectives/tuning.h"
#include "reduce/reduce.h"

namespace dicomm {

void all_reduce_direct(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op) {
  const int p = s.size(), r = s.rank();
  const size_t esize = dtype_size(dtype);
  const Tuning& tuning = s.tuning();
  const Partition blocks{count, static_cast<size_t>(p)};
  // One chunk count for every block, so both sides of every message agree on its step.
  const size_t nchunks = chunk_count(blocks.max_length() * esize, tuning.chunk_bytes, kMaxTagSteps / 2);
  const size_t stride = Partition{blocks.max_length(), nchunks}.max_length() * esize;
  auto chunks_of = [&](int b) { return Partition{blocks.length(b), nchunks}; };
  auto at = [&](int b, size_t k) { return buf + (blocks.offset(b) + chunks_of(b).offset(k)) * esize; };
  auto rs_step = [](size_t k) { return static_cast<uint32_t>(k); };
  auto ag_step = [&](size_t k) { return static_cast<uint32_t>(nchunks + k); };

  // Foreign chunks of the owned block land in a window of scratch stages, one slot per peer; a
  // stage is reused once its chunk is reduced. A running partial sum (p > 2) stays in scratch too.
  const size_t window = std::min(std::max<size_t>(tuning.recv_window, 1), nchunks);
  uint8_t* slots = s.scratch(window * static_cast<size_t>(p) * stride);
  uint8_t* partial = p > 2 ? s.scratch(stride) : nullptr;
  auto slot = [&](size_t k, int q) { return slots + ((k % window) * p + q) * stride; };
  const Partition own = chunks_of(r);
  std::vector<Transfer> rs(nchunks * p), ag(nchunks * p);
  auto post_rs_recvs = [&](size_t k) {
    for (int q = 0; q < p; ++q)
      if (q != r) rs[k * p + q] = s.recv(q, slot(k, q), own.length(k) * esize, rs_step(k));
  };
  for (size_t k = 0; k < window; ++k) post_rs_recvs(k);
  // All-gather receives go straight to their final place: a chunk's final value can only arrive
  // after its owner has taken this rank's contribution from that very place.
  for (int i = 1; i < p; ++i) {
    const int q = (r + i) % p;
    for (size_t k = 0; k < nchunks; ++k)
      ag[k * p + q] = s.recv(q, at(q, k), chunks_of(q).length(k) * esize, ag_step(k));
  }
  // Every contribution is announced at once: its owner pulls it when it gets to it.
  for (size_t k = 0; k < nchunks; ++k)
    for (int i = 1; i < p; ++i) {
      const int q = (r + i) % p;
      s.send(q, at(q, k), chunks_of(q).length(k) * esize, rs_step(k));
    }

  std::vector<const uint8_t*> src(p);
  for (size_t k = 0; k < nchunks; ++k) {
    const size_t len = own.length(k);
    uint8_t* out = at(r, k);
    for (int i = 1; i < p; ++i) s.wait(rs[k * p + (r + i) % p]);
    for (int q = 0; q < p; ++q) src[q] = q == r ? out : slot(k, q);
    // out aliases src[r]: each step reads an element before it writes it, and src[r] is read at
    // the latest by the last step, which writes out.
    uint8_t* acc = p > 2 ? partial : out;
    reduction::combine(acc, src[0], src[1], len, dtype, op);
    for (int q = 2; q < p; ++q) reduction::combine(q + 1 < p ? acc : out, acc, src[q], len, dtype, op);
    if (op == ReduceOp::kAvg) reduction::divide(out, len, dtype, p);
    if (k + window < nchunks) post_rs_recvs(k + window);
    for (int i = 1; i < p; ++i) s.send((r + i) % p, out, len * esize, ag_step(k));
  }
  for (auto& t : ag)
    if (t.request) s.wait(t);
}

}  // namespace dicomm
