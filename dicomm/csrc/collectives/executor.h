// Runs a communicator's collectives one after another on a thread of their own, so that callers get
// a request back at once and every rank executes collectives in the order it submitted them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/request.h"

namespace dicomm {

class CollectiveRequest;

class CollectiveExecutor {
 public:
  using Body = std::function<void(uint64_t seq)>;

  // `stalled_on`: what a collective that timed out may have been waiting for besides its peers'
  // messages (the engine's awaited address cards); "" for nothing.
  explicit CollectiveExecutor(std::function<std::string()> stalled_on = {});
  ~CollectiveExecutor();  // shutdown("communicator closed") and join

  RequestPtr submit(const std::string& what, Body body, uint64_t seq);
  // Fails queued (not yet started) collectives with PeerError(reason) and stops the thread after
  // the running one returns. The engine must abort point-to-point first so the running one ends.
  void shutdown(const std::string& reason);

 private:
  struct Item {
    std::shared_ptr<CollectiveRequest> request;
    Body body;
    uint64_t seq = 0;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::string stop_reason_;
  std::function<std::string()> stalled_on_;
  std::thread thread_;
};

}  // namespace dicomm
