// Binomial trees over ranks renumbered so the root is 0: virtual rank v's parent is v without its
// lowest set bit, its children are v + 2^j for 2^j below that bit. log2(p) rounds, each message
// whole; the choice for latency-bound sizes. Every pair exchanges at most one message, at step 0.
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "reduce/reduce.h"

namespace dicomm {
namespace {

struct TreeNode {
  int parent = -1;            // real rank; -1 at the root
  std::vector<int> children;  // real ranks, largest subtree first
};

TreeNode binomial_node(int rank, int size, int root) {
  const int v = (rank - root + size) % size;
  auto real = [&](int vr) { return (vr + root) % size; };
  TreeNode node;
  int mask = 1;
  while (mask < size) {
    if (v & mask) {
      node.parent = real(v - mask);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < size) node.children.push_back(real(v + mask));
  return node;
}

}  // namespace

void broadcast_binomial(Session& s, uint8_t* buf, size_t nbytes, int root) {
  const TreeNode node = binomial_node(s.rank(), s.size(), root);
  if (node.parent >= 0) {
    Transfer in = s.recv(node.parent, buf, nbytes, 0);
    s.wait(in);
  }
  for (int child : node.children) s.send(child, buf, nbytes, 0);
}

void reduce_binomial(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op,
                     int root) {
  const TreeNode node = binomial_node(s.rank(), s.size(), root);
  const size_t bytes = count * dtype_size(dtype);
  // Non-roots accumulate in scratch: their buffers are inputs only.
  uint8_t* acc = buf;
  if (node.parent >= 0) {
    acc = s.scratch(bytes);
    if (bytes) std::memcpy(acc, buf, bytes);
  }
  std::vector<Transfer> in;
  std::vector<uint8_t*> tmp;
  for (int child : node.children) {
    tmp.push_back(s.scratch(bytes));
    in.push_back(s.recv(child, tmp.back(), bytes, 0));
  }
  for (size_t i = 0; i < in.size(); ++i) {
    s.wait(in[i]);
    reduction::combine(acc, acc, tmp[i], count, dtype, op);
  }
  if (node.parent >= 0) s.send(node.parent, acc, bytes, 0);
  else if (op == ReduceOp::kAvg) reduction::divide(acc, count, dtype, s.size());
}

}  // namespace dicomm
