// Recursive doubling all_reduce: in round i each rank swaps its whole buffer with the rank whose
// (virtual) index differs in bit i and reduces, so after log2(p) rounds everyone holds the result.
// With p not a power of two, the first 2 * (p - 2^k) ranks pair up first: even ranks hand their
// data to the odd neighbour, sit out the rounds, and get the result back at the end.
//
// Every reduction puts the lower ranks' data first, so all ranks compute bit-identical results
// even where operand order matters (which NaN payload or signed zero wins).
#include <cstring>

#include "collectives/algorithms.h"
#include "reduce/reduce.h"

namespace dicomm {
namespace {

// Rounds use steps 0..log2(p)-1 (so round 0 meets the ring's first step when ranks disagree on
// the algorithm and the signature check fires); folding uses two steps beyond any round.
constexpr uint32_t kFoldStep = 64;
constexpr uint32_t kUnfoldStep = 65;

}  // namespace

void all_reduce_recursive_doubling(Session& s, uint8_t* buf, size_t count, DataType dtype,
                                   ReduceOp op) {
  const int p = s.size(), r = s.rank();
  const size_t bytes = count * dtype_size(dtype);
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int extra = p - pow2;
  uint8_t* tmp = s.scratch(bytes);

  int vrank;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      Transfer out = s.send(r + 1, buf, bytes, kFoldStep);
      // The result can only come back after the peer has consumed `out`.
      Transfer back = s.recv(r + 1, buf, bytes, kUnfoldStep);
      s.wait(out);
      s.wait(back);
      return;
    }
    Transfer in = s.recv(r - 1, tmp, bytes, kFoldStep);
    s.wait(in);
    reduction::combine(buf, tmp, buf, count, dtype, op);
    vrank = r / 2;
  } else {
    vrank = r - extra;
  }
  auto real_rank = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };

  for (int mask = 1, round = 0; mask < pow2; mask <<= 1, ++round) {
    const int vpeer = vrank ^ mask, peer = real_rank(vpeer);
    Transfer in = s.recv(peer, tmp, bytes, round);
    Transfer out = s.send(peer, buf, bytes, round);
    s.wait(in);
    s.wait(out);  // the peer may read `buf` until the send completes
    if (vrank < vpeer) reduction::combine(buf, buf, tmp, count, dtype, op);
    else reduction::combine(buf, tmp, buf, count, dtype, op);
  }
  if (op == ReduceOp::kAvg) reduction::divide(buf, count, dtype, p);
  if (r < 2 * extra) s.send(r - 1, buf, bytes, kUnfoldStep);
}

}  // namespace dicomm
