#include "work.h"

#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <atomic>
#include <deque>

#include "completer.h"
#include "core/types.h"
#include "errors.h"

namespace dicomm::torch_backend {
namespace {

bool finished(const RequestPtr& r) {
  try {
    return r->test();
  } catch (...) {  // failed: finished too
    return true;
  }
}

struct Orphan {
  std::vector<RequestPtr> requests;
  std::vector<at::Tensor> buffers;
};
std::mutex g_orphans_mu;
std::deque<Orphan> g_orphans;
std::atomic<bool> g_have_orphans{false};

}  // namespace

void sweep_orphans() {
  if (!g_have_orphans.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  auto done = [](const Orphan& o) {
    for (auto& r : o.requests)
      if (!finished(r)) return false;
    return true;
  };
  g_orphans.erase(std::remove_if(g_orphans.begin(), g_orphans.end(), done), g_orphans.end());
  g_have_orphans = !g_orphans.empty();
}

DicommWork::DicommWork(int rank, c10d::OpType op, std::vector<RequestPtr> requests,
                       std::vector<at::Tensor> result, std::chrono::milliseconds default_timeout)
    : c10d::Work(rank, op),
      requests_(std::move(requests)),
      result_(std::move(result)),
      default_timeout_(default_timeout) {}

c10::intrusive_ptr<DicommWork> DicommWork::all_of(int rank, std::vector<c10::intrusive_ptr<DicommWork>> works,
                                                  std::chrono::milliseconds default_timeout) {
  std::vector<RequestPtr> requests;
  std::vector<at::Tensor> result;
  for (auto& w : works) {
    std::lock_guard<std::mutex> lock(w->mutex_);
    requests.insert(requests.end(), w->requests_.begin(), w->requests_.end());
    result.insert(result.end(), w->result_.begin(), w->result_.end());
  }
  auto all = c10::make_intrusive<DicommWork>(rank, c10d::OpType::COALESCED, std::move(requests),
                                             std::move(result), default_timeout);
  for (auto& w : works)
    if (w->stream) all->stream = w->stream;
  // The engine is done with every request by now: each work finishes at once (its copy-back, its
  // size check) and reports its own failure.
  if (!works.empty())
    all->finish = [works = std::move(works)] {
      for (auto& w : works) w->wait();
    };
  return all;
}

DicommWork::~DicommWork() {
  if (keep.empty() || requests_done()) return;
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  g_orphans.push_back({std::move(requests_), std::move(keep)});
  g_have_orphans = true;
}

bool DicommWork::any_request_failed() const {
  for (auto& r : requests_)
    if (r->has_failed()) return true;
  return false;
}

bool DicommWork::requests_done() const {
  std::vector<RequestPtr> requests;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    requests = requests_;
  }
  for (auto& r : requests)
    if (!finished(r)) return false;
  return true;
}

void DicommWork::settle(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::timed_mutex> driving(waiting_, std::defer_lock);
  if (!driving.try_lock_until(deadline)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
    fail(Kind::kTimeout, "dicomm: Timed out after " + std::to_string(timeout.count()) +
                             " ms waiting for a dicomm operation that another thread is waiting for");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
  }
  std::exception_ptr error;
  try {
    // A batch (batch_isend_irecv, coalescing) fails at its first failure: waiting for its requests
    // in order would sit on one whose peer is fine but gone elsewhere (a send that is never
    // received) while a later one has already failed.
    const std::function<bool()> one_failed = [this] { return any_request_failed(); };
    for (size_t i = 0; i < requests_.size(); ++i) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      left = std::max(left, std::chrono::milliseconds(0));
      if (requests_.size() == 1) requests_[i]->wait(left);
      else requests_[i]->wait_unless(left, one_failed);
      if (requests_.size() > 1 && any_request_failed())
        for (auto& r : requests_) r->test();  // throws the failure
    }
    keep.clear();  // every request succeeded: the engine is done with the buffers
    if (expect_nbytes >= 0 && !requests_.empty()) {
      size_t got = requests_[0]->nbytes();
      if (static_cast<int64_t>(got) != expect_nbytes)
        fail(Kind::kMismatch, requests_[0]->describe() + ": received " + std::to_string(got) +
                                  " bytes but the tensor holds " + std::to_string(expect_nbytes) +
                                  " bytes; the sender's tensor must have the same size as the receiver's");
    }
    if (finish) finish();
  } catch (const dicomm::TimeoutError&) {
    error = as_backend_error(std::current_exception());
    if (!requests_done()) std::rethrow_exception(error);  // still in flight: may be waited again
  } catch (...) {
    error = as_backend_error(std::current_exception());
  }
  complete(error);
}

void DicommWork::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
    exception_ = error;
    completed_ = true;
    finish = nullptr;
  }
  cv_.notify_all();
  mark_future();
}

void DicommWork::mark_future() {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_ || future_marked_ || !completed_) return;
    future_marked_ = true;
    fut = future_;
  }
  // Callbacks run here, on this thread; device results are ordered on the op's stream.
  std::optional<c10::StreamGuard> guard;
  if (stream) guard.emplace(*stream);
  if (exception_) fut->setError(exception_);
  else fut->markCompleted(c10::IValue(result_));
}

bool DicommWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  if (!requests_done() && !any_request_failed()) return false;  // failed: complete, as wait() says
  try {
    settle(default_timeout_);
  } catch (...) {  // recorded in the work
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool DicommWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr DicommWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

int DicommWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_.empty() ? -1 : requests_[0]->source();
}

std::vector<at::Tensor> DicommWork::result() {
  wait();
  return result_;
}

void DicommWork::synchronize() { wait(); }

bool DicommWork::wait(std::chrono::milliseconds timeout) {
  settle(timeout == kNoTimeout ? default_timeout_ : timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> DicommWork::getFuture() {
  bool start = false, done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = completed_;
    if (!future_) {
      std::vector<c10::Device> devices;
      if (stream) devices.push_back(stream->device());
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), devices);
      start = true;
    }
  }
  if (start && done) {
    mark_future();
  } else if (start) {
    auto self = c10::intrusive_ptr<DicommWork>::reclaim_copy(this);
    run_on_completer([self] {
      try {
        self->settle(self->default_timeout_);
      } catch (...) {  // timed out with requests in flight: the future fails all the same
        self->complete(as_backend_error(std::current_exception()));
      }
    });
  }
  return future_;
}

}  // namespace dicomm::torch_backend
