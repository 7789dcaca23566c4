// Broadcast: binomial tree for small buffers; for large ones a chain root -> root+1 -> ... that
// forwards each chunk as soon as it arrives, so every link is busy at once and the time
// approaches one buffer transfer however many ranks there are.
#include "collectives/algorithms.h"
#include "collectives/launch.h"
#include "collectives/partition.h"
#include "collectives/tuning.h"

namespace dicomm {

void broadcast_chain(Session& s, uint8_t* buf, size_t nbytes, int root) {
  const int p = s.size();
  const int v = (s.rank() - root + p) % p;
  const int prev = (s.rank() + p - 1) % p, next = (s.rank() + 1) % p;
  const size_t nchunks = chunk_count(nbytes, s.tuning().chunk_bytes, kMaxTagSteps);
  const Partition part{nbytes, nchunks};
  std::vector<Transfer> in;
  if (v > 0)
    for (size_t k = 0; k < nchunks; ++k)
      in.push_back(s.recv(prev, buf + part.offset(k), part.length(k), k));
  for (size_t k = 0; k < nchunks; ++k) {
    if (v > 0) s.wait(in[k]);
    if (v + 1 < p) s.send(next, buf + part.offset(k), part.length(k), k);
  }
}

RequestPtr broadcast(Communicator& comm, void* buf, size_t nbytes, int root) {
  check_root(comm, root);
  check_buffer(reinterpret_cast<uintptr_t>(buf), nbytes, "buf");
  Signature sig{CollectiveKind::kBroadcast};
  sig.count = nbytes;
  sig.root = root;
  auto* data = static_cast<uint8_t*>(buf);
  const bool chain = nbytes >= Tuning::of(comm.config()).broadcast_chain_bytes;
  return launch(comm, sig, [=](Session& s) {
    if (s.size() == 1) return;
    if (chain) broadcast_chain(s, data, nbytes, root);
    else broadcast_binomial(s, data, nbytes, root);
  });
}

}  // namespace dicomm
