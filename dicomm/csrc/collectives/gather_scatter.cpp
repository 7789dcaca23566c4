// Gather and scatter: the root exchanges one message with every other rank directly. The root's
// link carries p - 1 blocks whatever the algorithm, and direct messages add no forwarding copies.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/launch.h"

namespace dicomm {

RequestPtr gather(Communicator& comm, const void* send, size_t nbytes, const Pointers& recv,
                  int root) {
  const int p = comm.size(), r = comm.rank();
  check_root(comm, root);
  check_buffer(reinterpret_cast<uintptr_t>(send), nbytes, "send_ptr");
  if (r == root) {
    check_length(recv.size(), p, "recv_ptrs", "one buffer per rank at the root");
    for (uintptr_t ptr : recv) check_buffer(ptr, nbytes, "recv_ptrs entry");
  } else {
    check_length(recv.size(), 0, "recv_ptrs", "only the root receives");
  }
  Signature sig{CollectiveKind::kGather};
  sig.count = nbytes;
  sig.root = root;
  const auto* src = static_cast<const uint8_t*>(send);
  return launch(comm, sig, [=](Session& s) {
    if (r != root) {
      s.send(root, src, nbytes, 0);
      return;
    }
    const uint8_t* from = src;
    for (int j = 0; j < p; ++j)
      if (j != r && overlaps(src, nbytes, as_ptr(recv[j]), nbytes)) {
        uint8_t* copy = s.scratch(nbytes);
        std::memcpy(copy, src, nbytes);
        from = copy;
        break;
      }
    for (int j = 0; j < p; ++j)
      if (j != r) s.recv(j, as_bytes(recv[j]), nbytes, 0);
    if (as_bytes(recv[r]) != from && nbytes) std::memmove(as_ptr(recv[r]), from, nbytes);
  });
}

RequestPtr scatter(Communicator& comm, const Pointers& send, void* recv, size_t nbytes, int root) {
  const int p = comm.size(), r = comm.rank();
  check_root(comm, root);
  check_buffer(reinterpret_cast<uintptr_t>(recv), nbytes, "recv_ptr");
  if (r == root) {
    check_length(send.size(), p, "send_ptrs", "one buffer per rank at the root");
    for (uintptr_t ptr : send) check_buffer(ptr, nbytes, "send_ptrs entry");
  } else {
    check_length(send.size(), 0, "send_ptrs", "only the root sends");
  }
  Signature sig{CollectiveKind::kScatter};
  sig.count = nbytes;
  sig.root = root;
  auto* dst = static_cast<uint8_t*>(recv);
  return launch(comm, sig, [=](Session& s) {
    if (r != root) {
      Transfer in = s.recv(root, dst, nbytes, 0);
      s.wait(in);
      return;
    }
    for (int j = 0; j < p; ++j)
      if (j != r) s.send(j, as_bytes(send[j]), nbytes, 0);
    // The root's own block last: `recv` may overlap blocks that are still being sent.
    s.wait_all();
    if (as_ptr(send[r]) != dst && nbytes) std::memmove(dst, as_ptr(send[r]), nbytes);
  });
}

}  // namespace dicomm
