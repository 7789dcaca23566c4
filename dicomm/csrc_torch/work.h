// The Work dicomm returns: engine requests plus what must happen once they complete.
//
// Waiting happens inside the engine, without the GIL. An error reaches C++ callers as an error
// (DDP's reducer, futures' consumers), never as a value. wait(timeout) is honoured; wait() uses
// the group's timeout. A future is completed by a completer thread (see completer.h), with the
// group's timeout as its deadline.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/request.h"

namespace dicomm::torch_backend {

class DicommWork : public c10d::Work {
 public:
  DicommWork(int rank, c10d::OpType op, std::vector<RequestPtr> requests,
             std::vector<at::Tensor> result, std::chrono::milliseconds default_timeout);
  ~DicommWork() override;
  // One work for a batch (coalescing): completes once every work of `works` has, fails with the
  // first failure; its result is their results in order.
  static c10::intrusive_ptr<DicommWork> all_of(int rank, std::vector<c10::intrusive_ptr<DicommWork>> works,
                                               std::chrono::milliseconds default_timeout);

  // Set by the backend before the work is handed out.
  std::function<void()> finish;       // runs once after every request succeeded (copy-back)
  std::vector<at::Tensor> keep;       // buffers the engine reads or writes until completion
  int64_t expect_nbytes = -1;         // a receive must fill its tensor exactly
  std::optional<c10::Stream> stream;  // device stream of staged results, for the future

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  bool requests_done() const;
  bool any_request_failed() const;  // lock-free (requests_ is fixed once handed out)
  // Waits up to `timeout` for the requests and completes the work. Throws a timeout (leaving
  // the work pending) only while a request is still in flight.
  void settle(std::chrono::milliseconds timeout);
  void complete(std::exception_ptr error);
  void mark_future();

  std::vector<RequestPtr> requests_;
  std::vector<at::Tensor> result_;
  const std::chrono::milliseconds default_timeout_;
  std::timed_mutex waiting_;  // one thread drives the requests at a time
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool future_marked_ = false;
};

// Drops works whose requests are still in flight keep their buffers here until the engine is
// done with them (fire-and-forget isend); called before new operations.
void sweep_orphans();

}  // namespace dicomm::torch_backend
