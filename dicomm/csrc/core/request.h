// Completion handle of an asynchronous operation (point-to-point or collective).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace dicomm {

class Request {
 public:
  virtual ~Request() = default;
  // True once the operation finished; throws the operation's error if it failed.
  virtual bool test() = 0;
  // Blocks until done or `timeout` passes (then throws TimeoutError naming op, peer, tag and bytes).
  // Throws the operation's error if it failed. Callers release the GIL before calling.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // Lock-free: true once the operation is known to have failed (false where it cannot tell
  // without a lock). Lets a caller that waits for several operations stop at the first failure.
  virtual bool has_failed() const { return false; }
  // wait() that also returns, without throwing, once `give_up()` holds (checked whenever the wait
  // wakes; it must not take locks). A request that cannot be woken by it simply waits.
  virtual void wait_unless(std::chrono::milliseconds timeout, const std::function<bool()>& give_up) {
    (void)give_up;
    wait(timeout);
  }
  // For receives: the rank the message came from (useful with kAnySource). -1 before completion.
  virtual int source() const = 0;
  // Bytes actually transferred (for a receive, the message size).
  virtual size_t nbytes() const = 0;
  // Human-readable description: "recv from rank 1 tag 7 (4096 B)".
  virtual std::string describe() const = 0;
};

using RequestPtr = std::shared_ptr<Request>;

}  // namespace dicomm
