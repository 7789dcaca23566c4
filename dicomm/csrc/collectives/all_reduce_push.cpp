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
// Work stealing (work_stealing.h): a block is cut into chunks, and whoever reduces a chunk first
// claims it in a word all ranks share. A rank takes its own block's chunks in order, then any chunk
// of another block nobody has claimed yet, so a rank the scheduler left behind has its block reduced
// by the others; "done" then means "every chunk is claimed, and the ones I claimed are pushed".
//
// Every element is reduced in rank order (x0 op x1 op ... op x(p-1)), as the direct algorithm does.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <sys/uio.h>
#include <thread>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/huge_pages.h"
#include "collectives/partition.h"
#include "collectives/tuning.h"
#include "collectives/work_stealing.h"
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
  uint64_t address;    // the buffer in the sender's memory
  uint64_t can;        // Can: whether the sender can read and write the memory of every peer
  uint64_t next_call;  // the number the sender's communicator gives its next push all_reduce
  int64_t claims_fd;   // rank 0: the descriptor of its claim words (work_stealing.h); -1: none
  uint64_t steal;      // 1: the sender has the claim words mapped and may steal
};

constexpr uint64_t kMaxCall = uint64_t{1} << 62;

// The fused combine keeps one chunk per rank in scratch; beyond this many ranks, pairwise passes.
constexpr int kMaxFusedRanks = 16;

// Blocks (one per rank) and their chunks, and each chunk's claim word: all of a call's chunks fit the
// claim words (chunks grow past the chunk size where they would not).
class Layout {
 public:
  Layout(size_t count, size_t esize, int p, size_t chunk_bytes) : blocks_{count, static_cast<size_t>(p)} {
    size_t first = 0;
    for (int b = 0; b < p; ++b) {
      const size_t len = blocks_.length(b);
      const Partition c{len, chunk_count(len * esize, chunk_bytes, WorkStealing::kWords / p)};
      chunks_.push_back(c);
      first_.push_back(first);
      first += c.parts;
      max_chunk_bytes = std::max(max_chunk_bytes, c.max_length() * esize);
    }
  }
  size_t chunks(int b) const { return chunks_[b].parts; }
  size_t offset(int b, size_t k) const { return blocks_.offset(b) + chunks_[b].offset(k); }  // elements
  size_t length(int b, size_t k) const { return chunks_[b].length(k); }
  size_t word(int b, size_t k) const { return first_[b] + k; }
  size_t max_chunk_bytes = 0;

 private:
  Partition blocks_;
  std::vector<Partition> chunks_;
  std::vector<size_t> first_;
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
  WorkStealing& ws = s.work_stealing();
  const bool steal_on = s.tuning().all_reduce_steal;
  std::vector<int64_t> pid(p, 0);
  Can own = reach(s, pid);
  if (own != kCannot) collapse_into_huge_pages(buf, count * esize);  // before peers pin it
  const uint64_t address = reinterpret_cast<uint64_t>(buf);
  auto mine = [&] {
    Reach m{address, own, ws.next_call, -1, 0};
    if (steal_on && own != kCannot) {
      if (r == 0) m.claims_fd = ws.offer();
      m.steal = ws.mapped() ? 1 : 0;
    }
    return m;
  };
  // A rank maps rank 0's claim words as soon as it knows where they are: stealing starts with the
  // first call every rank had them mapped at its start.
  auto attach = [&](const std::vector<Reach>& all) {
    if (r != 0 && steal_on && !ws.mapped() && all[0].claims_fd >= 0 && pid[0] > 0) ws.attach(pid[0], all[0].claims_fd);
  };
  std::vector<Reach> theirs = exchange(s, mine());
  Can can = decide(theirs);
  // Before every rank had connected to every other: the exchange just did, so ask once more.
  if (can == kUnknown) {
    own = reach(s, pid);
    attach(theirs);
    can = decide(theirs = exchange(s, mine()));
  }
  if (can != kCan) return false;
  attach(theirs);

  // The call's number: the highest any rank expects (all ranks agree; a failed call never leaves
  // them apart, as it ends the communicator, but the maximum needs no such argument).
  uint64_t call = 0;
  bool steal = true;
  for (const Reach& x : theirs) {
    call = std::max(call, x.next_call);
    steal = steal && x.steal == 1;
  }
  // A number near the top could wrap, and more ranks than claim words would not fit: no stealing, on
  // every rank alike.
  steal = steal && call < kMaxCall && static_cast<size_t>(p) <= WorkStealing::kWords;
  ws.next_call = std::min(call, kMaxCall) + 1;

  const Layout layout(count, esize, p, s.tuning().chunk_bytes);
  // Fused: every peer's chunk lands in a slot of its own, then one pass combines all p inputs into
  // the output (reduction::combine_many). Else two landing slots (the next peer's chunk lands while
  // the last one is still an operand) and a running sum, combined a pair at a time. Cache-sized.
  // At 2 ranks one pairwise pass is already one pass.
  const bool fused = s.tuning().all_reduce_fused && p > 2 && p <= kMaxFusedRanks;
  std::vector<uint8_t*> slots(fused ? p : 2);
  for (int q = 0; q < static_cast<int>(slots.size()); ++q)
    if (!fused || q != r) slots[q] = s.scratch(layout.max_chunk_bytes);
  uint8_t* partial = fused ? nullptr : s.scratch(layout.max_chunk_bytes);
  std::vector<const void*> inputs(p);
  auto reduce = [&](int block, size_t k) {
    const size_t len = layout.length(block, k), bytes = len * esize, at = layout.offset(block, k) * esize;
    uint8_t* out = buf + at;
    if (fused) {
      for (int q = 0; q < p; ++q) {
        inputs[q] = out;  // this rank's own contribution is read in place
        if (q != r) {
          cross_copy(false, pid[q], q, slots[q], theirs[q].address + at, bytes);
          inputs[q] = slots[q];
        }
      }
      reduction::combine_many(out, inputs.data(), p, len, dtype, op);
    } else {
      const uint8_t* acc = nullptr;
      for (int q = 0; q < p; ++q) {
        uint8_t* src = out;
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
    }
    if (op == ReduceOp::kAvg) reduction::divide(out, len, dtype, p);
    for (int i = 1; i < p; ++i) {
      const int q = (r + i) % p;  // peers in a different order on every rank: no one is written by all at once
      cross_copy(true, pid[q], q, out, theirs[q].address + at, bytes);
    }
  };

  if (const unsigned delay = s.tuning().all_reduce_push_delay_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  if (!steal) {
    for (size_t k = 0; k < layout.chunks(r); ++k) reduce(r, k);
  } else {
    // Its own block first, front to back; then every other block back to front, so that a thief
    // and the block's owner meet in the middle rather than contend chunk by chunk.
    for (size_t k = 0; k < layout.chunks(r); ++k)
      if (ws.claim(layout.word(r, k), call)) reduce(r, k);
    for (int i = 1; i < p; ++i) {
      const int b = (r + i) % p;
      for (size_t k = layout.chunks(b); k-- > 0;)
        if (ws.claim(layout.word(b, k), call)) {
          reduce(b, k);
          ws.chunks_stolen.fetch_add(1, std::memory_order_relaxed);
        }
    }
  }
  // Every chunk of every block is claimed by now (this rank tried them all) and this rank's are done;
  // once every peer says the same, nobody reads or writes this rank's buffer any more.
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
