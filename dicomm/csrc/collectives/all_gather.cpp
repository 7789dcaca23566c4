// All-gather: for small totals every rank sends its block to every other rank at once (one round
// of latency); for large ones a ring that forwards each chunk as soon as it arrives, so each link
// carries (p - 1) blocks whatever the transport (shared memory or a network).
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/launch.h"
#include "collectives/partition.h"
#include "collectives/tuning.h"

namespace dicomm {

void all_gather_direct(Session& s, const uint8_t* send, size_t nbytes, const Pointers& recv) {
  const int p = s.size(), r = s.rank();
  for (int i = 1; i < p; ++i) {
    const int from = (r + p - i) % p;
    s.recv(from, as_bytes(recv[from]), nbytes, 0);
  }
  for (int i = 1; i < p; ++i) s.send((r + i) % p, send, nbytes, 0);
}

void all_gather_ring(Session& s, const uint8_t* send, size_t nbytes, const Pointers& recv) {
  const int p = s.size(), r = s.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const size_t steps = p - 1;
  const size_t nchunks = chunk_count(nbytes, s.tuning().chunk_bytes, kMaxTagSteps / steps);
  const Partition part{nbytes, nchunks};
  auto step_of = [&](size_t t, size_t k) { return static_cast<uint32_t>(t * nchunks + k); };
  // Step t receives block (r - t - 1) and forwards it at step t + 1.
  auto block_at = [&](size_t t) { return (r + p - 1 - static_cast<int>(t)) % p; };  // t < p - 1
  std::vector<Transfer> in;
  for (size_t t = 0; t < steps; ++t)
    for (size_t k = 0; k < nchunks; ++k)
      in.push_back(s.recv(prev, as_bytes(recv[block_at(t)]) + part.offset(k), part.length(k),
                          step_of(t, k)));
  for (size_t k = 0; k < nchunks; ++k)
    s.send(next, send + part.offset(k), part.length(k), step_of(0, k));
  for (size_t t = 0; t < steps; ++t)
    for (size_t k = 0; k < nchunks; ++k) {
      s.wait(in[t * nchunks + k]);
      if (t + 1 < steps)
        s.send(next, as_bytes(recv[block_at(t)]) + part.offset(k), part.length(k),
               step_of(t + 1, k));
    }
}

RequestPtr all_gather(Communicator& comm, const void* send, size_t nbytes, const Pointers& recv) {
  const int p = comm.size(), r = comm.rank();
  check_length(recv.size(), p, "recv_ptrs", "one buffer per rank");
  check_buffer(reinterpret_cast<uintptr_t>(send), nbytes, "send_ptr");
  for (uintptr_t ptr : recv) check_buffer(ptr, nbytes, "recv_ptrs entry");
  Signature sig{CollectiveKind::kAllGather};
  sig.count = nbytes;
  const bool ring = nbytes * p >= Tuning::of(comm.config()).all_gather_ring_bytes;
  const auto* src = static_cast<const uint8_t*>(send);
  return launch(comm, sig, [=](Session& s) {
    const uint8_t* from = src;
    // A send buffer inside another rank's slot would be overwritten while still being sent.
    for (int j = 0; j < p; ++j)
      if (j != r && overlaps(src, nbytes, as_ptr(recv[j]), nbytes)) {
        uint8_t* copy = s.scratch(nbytes);
        std::memcpy(copy, src, nbytes);
        from = copy;
        break;
      }
    if (as_bytes(recv[r]) != from && nbytes) std::memmove(as_ptr(recv[r]), from, nbytes);
    if (p == 1) return;
    if (ring) all_gather_ring(s, from, nbytes, recv);
    else all_gather_direct(s, from, nbytes, recv);
  });
}

}  // namespace dicomm
