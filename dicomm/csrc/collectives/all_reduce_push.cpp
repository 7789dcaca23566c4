// Push all_reduce: between ranks of one host that may read and write each other's memory (cross-memory
// attach), every rank reduces its own block straight out of its peers' buffers, chunk by chunk, and
// writes each reduced chunk, still in its cache, straight into its peers' buffers. Each byte crosses
// memory the fewest times an all_reduce allows (every input read once, every output written once:
// docs/benchmarks.md, "all_reduce against its memory-traffic bound"), and no rank waits for another
// between its first message and its last: a descheduled peer's data is read and written without it.
//
// Messages: every rank first tells every peer where its buffer is and whether it can reach every
// peer's memory; only if all can does the push run (else the caller runs another algorithm), so all
// ranks decide alike. Once a rank has pushed its block into every peer it tells them so; it returns
// when every peer has told it the same: by then nobody reads or writes its buffer any more.
//
// Every element is reduced in rank order (x0 op x1 op ... op x(p-1)), as the direct algorithm does.
#include <algorithm>
#include <cerrno>
#include <string>
#include <sys/uio.h>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/huge_pages.h"
#include "collectives/partition.h"
#include "collectives/tuning.h"
#include "reduce/reduce.h"
#include "transport/socket.h"

namespace dicomm {
namespace {

// The exchange is on step 0, where every all_reduce algorithm starts, so ranks that called different
// all_reduces meet on their first message and fail with a MismatchError; a fallback's own step-0
// messages follow it in order (messages of one pair and tag never overtake each other). The last
// step is past any other algorithm's (they use at most half the tag space).
constexpr uint32_t kAddressStep = 0, kDoneStep = kMaxTagSteps - 1;

enum Can : uint64_t { kCannot = 0, kCan = 1, kUnknown = 2 };  // kUnknown: not every peer connected yet

struct Reach {
  uint64_t address;  // the buffer in the sender's memory
  uint64_t can;      // Can: whether the sender can read and write the memory of every peer
};

// This rank's reach, and the pids of its peers where it has them.
Can reach(const Session& s, std::vector<int64_t>& pid) {
  Can can = kCan;
  for (int q = 0; q < s.size(); ++q) {
    if (q == s.rank()) continue;
    pid[q] = s.cma_pid(q);
    if (pid[q] == 0) return kCannot;
    if (pid[q] < 0) can = kUnknown;
  }
  return can;
}

// Tells every peer `mine`, returns what every peer told (this rank's own entry: `mine`).
std::vector<Reach> exchange(Session& s, const Reach& mine) {
  std::vector<Reach> all(s.size(), mine);
  std::vector<Transfer> got;
  for (int q = 0; q < s.size(); ++q)
    if (q != s.rank()) {
      s.send(q, &mine, sizeof mine, kAddressStep);
      got.push_back(s.recv(q, &all[q], sizeof(Reach), kAddressStep));
    }
  for (auto& t : got) s.wait(t);
  s.wait_all();  // the sends read `mine`, which the caller may drop
  return all;
}

// What all ranks decide from what every rank told: the same on every rank.
Can decide(const std::vector<Reach>& all) {
  Can can = kCan;
  for (const Reach& x : all) {
    if (x.can == kUnknown) can = kUnknown;
    else if (x.can != kCan) return kCannot;
  }
  return can;
}

// Moves `bytes` between this process (`local`) and `pid`'s memory at `remote`, whole.
void cross_copy(bool write, int64_t pid, int peer, uint8_t* local, uint64_t remote, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec l{local + done, bytes - done};
    iovec r{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = write ? process_vm_writev(static_cast<pid_t>(pid), &l, 1, &r, 1, 0)
                            : process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      throw PeerError(std::string(write ? "writing into" : "reading") + " rank " + std::to_string(peer) +
                      "'s buffer failed: " + transport::errno_text(err) +
                      (err == ESRCH ? " (its process exited)" : "") +
                      (err == EFAULT ? " (it named an address outside its memory)" : ""));
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

bool all_reduce_push(Session& s, uint8_t* buf, size_t count, DataType dtype, ReduceOp op) {
  const int p = s.size(), r = s.rank();
  const size_t esize = dtype_size(dtype);
  std::vector<int64_t> pid(p, 0);
  const Can own = reach(s, pid);
  if (own != kCannot) collapse_into_huge_pages(buf, count * esize);  // before peers pin it
  const uint64_t address = reinterpret_cast<uint64_t>(buf);
  std::vector<Reach> theirs = exchange(s, Reach{address, own});
  Can can = decide(theirs);
  // Before every rank had connected to every other: the exchange just did, so ask once more.
  if (can == kUnknown) can = decide(theirs = exchange(s, Reach{address, reach(s, pid)}));
  if (can != kCan) return false;

  const Partition blocks{count, static_cast<size_t>(p)};
  const size_t base = blocks.offset(r), len_all = blocks.length(r);
  const size_t nchunks = chunk_count(len_all * esize, s.tuning().chunk_bytes, ~size_t{0});
  const Partition chunks{len_all, nchunks};
  const size_t stride = chunks.max_length() * esize;
  // Two landing slots (the next peer's chunk lands while the last one is still an operand) and the
  // running sum; all cache-sized.
  uint8_t* slots[2] = {s.scratch(stride), s.scratch(stride)};
  uint8_t* partial = s.scratch(stride);
  for (size_t k = 0; k < nchunks; ++k) {
    const size_t len = chunks.length(k), bytes = len * esize, at = (base + chunks.offset(k)) * esize;
    uint8_t* out = buf + at;
    const uint8_t* acc = nullptr;
    for (int q = 0; q < p; ++q) {
      uint8_t* src = out;  // this rank's own contribution is read in place
      if (q != r) {
        src = slots[q % 2];
        cross_copy(false, pid[q], q, src, theirs[q].address + at, bytes);
      }
      if (q == 0) {
        acc = src;
        continue;
      }
      // The last step writes out, which may be an operand: each element is read before it is written.
      uint8_t* dst = q + 1 < p ? partial : out;
      reduction::combine(dst, acc, src, len, dtype, op);
      acc = dst;
    }
    if (op == ReduceOp::kAvg) reduction::divide(out, len, dtype, p);
    for (int i = 1; i < p; ++i) {
      const int q = (r + i) % p;  // peers in a different order on every rank: no one is written by all at once
      cross_copy(true, pid[q], q, out, theirs[q].address + at, bytes);
    }
  }
  std::vector<Transfer> got;
  for (int q = 0; q < p; ++q)
    if (q != r) {
      s.send(q, nullptr, 0, kDoneStep);
      got.push_back(s.recv(q, nullptr, 0, kDoneStep));
    }
  for (auto& t : got) s.wait(t);
  s.wait_all();
  return true;
}

}  // namespace dicomm
