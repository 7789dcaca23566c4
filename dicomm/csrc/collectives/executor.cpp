#include "collectives/executor.h"

#include <exception>

#include "core/communicator.h"
#include "core/types.h"

namespace dicomm {

// Completion state of one collective; completed by the executor thread.
class CollectiveRequest : public Request {
 public:
  CollectiveRequest(std::string what, std::function<std::string()> stalled_on)
      : what_(std::move(what)), stalled_on_(std::move(stalled_on)) {}

  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    return done_;
  }
  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      lock.unlock();  // what it stalled on may take a store round trip
      const std::string why = stalled_on_ ? stalled_on_() : "";
      throw TimeoutError("Timed out after " + std::to_string(timeout.count()) + " ms waiting for " + what_ +
                         (why.empty() ? "" : " (" + why + ")"));
    }
    if (error_) std::rethrow_exception(error_);
  }
  int source() const override { return -1; }
  size_t nbytes() const override { return 0; }
  std::string describe() const override { return what_; }

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  const std::string what_;
  const std::function<std::string()> stalled_on_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

CollectiveExecutor::CollectiveExecutor(std::function<std::string()> stalled_on)
    : stalled_on_(std::move(stalled_on)), thread_([this] { run(); }) {}

CollectiveExecutor::~CollectiveExecutor() {
  shutdown("communicator closed");
  if (thread_.joinable()) thread_.join();
}

RequestPtr CollectiveExecutor::submit(const std::string& what, Body body, uint64_t seq) {
  auto request = std::make_shared<CollectiveRequest>(what, stalled_on_);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    request->finish(std::make_exception_ptr(PeerError(what + " failed: " + stop_reason_)));
    return request;
  }
  queue_.push_back({request, std::move(body), seq});
  cv_.notify_one();
  return request;
}

void CollectiveExecutor::shutdown(const std::string& reason) {
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& item : dropped)
    item.request->finish(std::make_exception_ptr(
        PeerError(item.request->describe() + " failed: " + reason)));
}

void CollectiveExecutor::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      item.body(item.seq);
    } catch (...) {
      error = std::current_exception();
    }
    item.request->finish(error);
  }
}

}  // namespace dicomm
