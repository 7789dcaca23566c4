// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k, so
// after ceil(log2 p) rounds each rank has heard, directly or not, from every other one. Works for
// any p, not only powers of two.
#include "collectives/algorithms.h"
#include "collectives/launch.h"

namespace dicomm {

RequestPtr barrier(Communicator& comm) {
  return launch(comm, Signature{CollectiveKind::kBarrier}, [](Session& s) {
    const int p = s.size(), r = s.rank();
    uint32_t round = 0;
    for (int dist = 1; dist < p; dist *= 2, ++round) {
      Transfer in = s.recv((r + p - dist) % p, nullptr, 0, round);
      s.send((r + dist) % p, nullptr, 0, round);
      s.wait(in);
    }
  });
}

}  // namespace dicomm
