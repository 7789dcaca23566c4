// Work stealing in the push all_reduce (all_reduce_push.cpp): one claim word per chunk, shared by
// every rank of a communicator, so that a rank done with its own block reduces the chunks of a rank
// that the scheduler left behind. Rank 0 creates the words in a sealed memfd; every other rank maps
// that same memfd, which it opens through /proc/<rank 0's pid>/fd/<n> (the kernel allows that only to
// whoever may read rank 0's memory, which the push algorithm needs anyway).
//
// A word holds the number of the last call that claimed its chunk. Calls are numbered alike on every
// rank, so a new call's claims need no reset, and no barrier: a rank starts claiming in call e + 1
// only after every rank told it that it is done with call e.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/unique_fd.h"

namespace dicomm {

class WorkStealing {
 public:
  static constexpr size_t kWords = 4096;  // chunks per call at most (32 KiB of words)

  WorkStealing() = default;
  ~WorkStealing();
  WorkStealing(const WorkStealing&) = delete;
  WorkStealing& operator=(const WorkStealing&) = delete;

  // Rank 0: creates the words once; the descriptor peers open, or -1 where they cannot be created.
  int64_t offer();
  // Other ranks: maps the words rank 0 offered (its pid, as the kernel reported it, and descriptor).
  // False where that fails; the rank then never steals, and its peers learn so from it.
  bool attach(int64_t pid, int64_t fd);
  bool mapped() const { return words_ != nullptr; }

  // Claims chunk `i` (< kWords) for call `call`: true for exactly one rank per call.
  bool claim(size_t i, uint64_t call);

  uint64_t next_call = 1;  // the next call's number, agreed by every rank at its start
  // Chunks of other ranks' blocks this rank reduced (Communicator::stats "all_reduce_chunks_stolen").
  std::atomic<int64_t> chunks_stolen{0};

 private:
  bool map(int fd);
  transport::UniqueFd fd_;  // rank 0's: kept open so that peers can open it
  uint64_t* words_ = nullptr;
  bool failed_ = false;  // tried and failed: not again
};

}  // namespace dicomm
