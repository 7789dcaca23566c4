// One collective running on one rank: posts its point-to-point messages with the collective's tag
// and signature, waits within the communicator's timeout, checks received sizes, and owns the
// scratch memory the messages land in.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives/tuning.h"
#include "core/communicator.h"

namespace dicomm {

// A posted message; Session::wait completes it.
struct Transfer {
  RequestPtr request;
  int peer = -1;
  size_t bytes = 0;
  bool is_recv = false;
  bool done = false;
  uint32_t step = 0;
};

class Session {
 public:
  // `meta` is the encoded Signature every message carries unless a call passes its own.
  Session(Communicator& comm, uint64_t seq, std::string what, uint64_t meta);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Tuning& tuning() const { return tuning_; }  // the communicator's
  int64_t cma_pid(int peer) const { return comm_.cma_pid(peer); }  // Communicator::cma_pid
  WorkStealing& work_stealing() { return comm_.work_stealing(); }  // the communicator's

  // Tag = collective_tag(seq, step). Both sides of a message must use the same step.
  Transfer send(int peer, const void* buf, size_t bytes, uint32_t step);
  Transfer recv(int peer, void* buf, size_t bytes, uint32_t step);
  Transfer send(int peer, const void* buf, size_t bytes, uint32_t step, uint64_t meta);
  Transfer recv(int peer, void* buf, size_t bytes, uint32_t step, uint64_t meta);

  // Blocks until `t` completes, at the latest at the collective's deadline (start + timeout).
  // A receive must bring exactly the bytes posted, else MismatchError.
  void wait(Transfer& t);
  // Waits for every transfer posted so far (sends nobody waited for, mostly).
  void wait_all();

  // Uninitialised scratch memory that lives as long as the session.
  uint8_t* scratch(size_t bytes);

  // Turns the error that stopped the algorithm into the collective's error: aborts the
  // communicator (messages still in flight would otherwise land in memory that is about to be
  // freed, and peers would wait for messages that never come), then rethrows the same error
  // class with the collective and rank in front.
  [[noreturn]] void fail(const std::exception_ptr& error);

 private:
  Transfer post(bool is_recv, int peer, void* buf, size_t bytes, uint32_t step, uint64_t meta);
  // A transfer that failed when it was posted (a send to a rank that is gone) ends the collective
  // before it waits on another rank; later failures of sends fail the collective's posted
  // receives in the engine. Each transfer is looked at once.
  void check_posted();
  size_t checked_ = 0;

  Communicator& comm_;
  const int rank_;
  const int size_;
  const uint64_t seq_;
  const std::string what_;
  const uint64_t meta_;
  const Tuning tuning_;
  const std::chrono::steady_clock::time_point deadline_;
  std::vector<RequestPtr> posted_;
  std::vector<std::unique_ptr<uint8_t[]>> scratch_;
};

}  // namespace dicomm
