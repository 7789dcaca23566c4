#include "completer.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace dicomm::torch_backend {
namespace {

constexpr auto kIdleExit = std::chrono::seconds(30);

struct Pool {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  size_t idle = 0;  // threads waiting for a task and not yet promised one

  void work() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      ++idle;
      bool got = cv.wait_for(lock, kIdleExit, [&] { return !tasks.empty(); });
      if (!got) {  // idle for long: exit (tasks pushed later start their own thread)
        --idle;
        return;
      }
      std::function<void()> task = std::move(tasks.front());
      tasks.pop_front();
      lock.unlock();
      task();
      task = nullptr;
      lock.lock();
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: detached threads may use it at exit
  return *p;
}

}  // namespace

void run_on_completer(std::function<void()> task) {
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.idle > 0) {
      --p.idle;  // promised to this task: a second task must not count on the same thread
      p.tasks.push_back(std::move(task));
      p.cv.notify_one();
      return;
    }
  }
  // No idle thread: a new one runs this task, then serves like any other.
  std::thread([&p, task = std::move(task)]() mutable {
    task();
    task = nullptr;
    p.work();
  }).detach();
}

}  // namespace dicomm::torch_backend
