// The completion handle of one isend/irecv. Its state is written by the engine under the engine
// lock and read lock-free by test(); wait() lets the caller drive progress itself.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "core/request.h"
#include "core/types.h"
#include "transport/transport.h"

namespace dicomm {

class Engine;

// Requests that know the timeout `wait(None)` should use (the communicator's).
class HasDefaultTimeout {
 public:
  virtual ~HasDefaultTimeout() = default;
  virtual std::chrono::milliseconds default_timeout() const = 0;
};

[[noreturn]] void throw_error(ErrorKind kind, const std::string& text);
std::string describe_tag(Tag tag);

class P2PRequest : public Request, public HasDefaultTimeout {
 public:
  enum class Op { kSend, kRecv };
  P2PRequest(std::shared_ptr<Engine> engine, Op op, int peer, Tag tag, uint64_t meta, void* buf, size_t bytes);

  bool test() override;
  void wait(std::chrono::milliseconds timeout) override;
  bool has_failed() const override { return failed(); }
  void wait_unless(std::chrono::milliseconds timeout, const std::function<bool()>& give_up) override;
  int source() const override { return done() ? source_ : -1; }
  size_t nbytes() const override { return nbytes_; }
  std::string describe() const override;
  std::chrono::milliseconds default_timeout() const override;

  // Engine side, under the engine lock.
  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool failed() const { return state_.load(std::memory_order_acquire) == kFailed; }
  void complete(int source, size_t nbytes);
  void fail(ErrorKind kind, const std::string& text);
  void rethrow_if_failed() const;

  const Op op;
  const int peer;  // kAnySource for any-source receives
  const Tag tag;
  const uint64_t meta;
  void* const buf;
  const size_t capacity;
  transport::SendOp send_op;
  transport::RecvOp recv_op;
  int matched_from = -1;  // receives: the source once matched
  // The place of a receive that timed out while an any-source receive with its tag was posted
  // ahead of it: the message that reaches this place is the one it would have taken, and is
  // discarded (Engine::time_out).
  bool withdrawn = false;

 private:
  enum State { kPending = 0, kDone = 1, kFailed = 2 };
  std::shared_ptr<Engine> engine_;
  std::atomic<int> state_{kPending};
  int source_ = -1;
  size_t nbytes_ = 0;
  ErrorKind error_kind_ = ErrorKind::kPeer;
  std::string error_;
};

}  // namespace dicomm
