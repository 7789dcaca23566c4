// All-to-all with uneven sizes: every rank posts all its receives, then sends to rank + 1,
// rank + 2, ... so that no rank is everyone's first target. Each message carries its own size in
// the signature, so a pair that disagrees on a size fails with MismatchError.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/launch.h"

namespace dicomm {

RequestPtr all_to_all(Communicator& comm, const Pointers& send, const Sizes& send_bytes,
                      const Pointers& recv, const Sizes& recv_bytes) {
  const int p = comm.size(), r = comm.rank();
  check_length(send.size(), p, "send_ptrs", "one buffer per rank");
  check_length(send_bytes.size(), p, "send_nbytes", "one size per rank");
  check_length(recv.size(), p, "recv_ptrs", "one buffer per rank");
  check_length(recv_bytes.size(), p, "recv_nbytes", "one size per rank");
  for (int j = 0; j < p; ++j) {
    check_buffer(send[j], send_bytes[j], "send_ptrs entry");
    check_buffer(recv[j], recv_bytes[j], "recv_ptrs entry");
  }
  if (send_bytes[r] != recv_bytes[r])
    throw ValueError("send_nbytes[" + std::to_string(r) + "] = " + std::to_string(send_bytes[r]) +
                     " but recv_nbytes[" + std::to_string(r) + "] = " +
                     std::to_string(recv_bytes[r]) + ": this rank's block to itself must fit");
  size_t out_total = 0, in_total = 0;
  for (int j = 0; j < p; ++j) out_total += send_bytes[j], in_total += recv_bytes[j];
  const std::string what = "all_to_all(" + std::to_string(out_total) + " B out, " +
                           std::to_string(in_total) + " B in)";
  return launch(comm, Signature{CollectiveKind::kAllToAll}, [=](Session& s) {
    // Sending from a buffer that a receive overwrites (in place) needs a copy of the sends.
    bool overlap = false;
    for (int i = 0; i < p && !overlap; ++i)
      for (int j = 0; j < p && !overlap; ++j)
        overlap = overlaps(as_ptr(send[i]), send_bytes[i], as_ptr(recv[j]), recv_bytes[j]);
    Pointers from = send;
    if (overlap)
      for (int i = 0; i < p; ++i) {
        uint8_t* copy = s.scratch(send_bytes[i]);
        if (send_bytes[i]) std::memcpy(copy, as_ptr(send[i]), send_bytes[i]);
        from[i] = reinterpret_cast<uintptr_t>(copy);
      }
    if (from[r] != recv[r] && recv_bytes[r])
      std::memmove(as_ptr(recv[r]), as_ptr(from[r]), recv_bytes[r]);
    auto meta = [&](size_t bytes) {
      Signature pair{CollectiveKind::kAllToAll};
      pair.count = bytes;
      return pair.encode();
    };
    for (int i = 1; i < p; ++i) {
      const int j = (r + p - i) % p;
      s.recv(j, as_bytes(recv[j]), recv_bytes[j], 0, meta(recv_bytes[j]));
    }
    for (int i = 1; i < p; ++i) {
      const int j = (r + i) % p;
      s.send(j, as_bytes(from[j]), send_bytes[j], 0, meta(send_bytes[j]));
    }
  }, what);
}

}  // namespace dicomm
