// The autograd engine's worker threads of this device (one per device index).
//
// Queues: the engine sizes its per-device ready queues once, at its first backward, from the device guards
// registered then; a device registered later would find no queue for its index. After attach, this gives
// the engine the queues and worker threads it would have started had the device existed then, the way
// Engine::start_device_threads does. Called while no backward pass runs.
//
// Draining at exit: a worker thread drops its reference to a finished backward's GraphTask after it has
// woken the caller, so it may be the last owner. The GraphTask's thread-local state holds Python objects
// (torch stashes a copy of the caller's contextvars Context in it at every backward), and releasing them
// takes the GIL from inside a destructor. If the caller has meanwhile reached interpreter finalization,
// taking the GIL ends the worker with pthread_exit, whose forced unwind cannot cross the destructor's
// noexcept: "terminate called without an active exception". The drain, run from Python's atexit (the
// interpreter intact, the GIL released), waits until every worker thread has finished what it ran before.
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "device.h"
#include "runtime.h"

namespace diopi_bindings {

namespace {

// The queues are a protected member: a pointer to it, taken through a derived class, reads it on any
// engine (the engine in use is the Python engine, a subclass).
struct EngineQueues : torch::autograd::Engine {
  static std::vector<std::shared_ptr<torch::autograd::ReadyQueue>>& of(torch::autograd::Engine& engine) {
    constexpr auto member = &EngineQueues::device_ready_queues_;
    return engine.*member;
  }
};

// Does nothing; queued on a worker thread, it runs only once the thread is done with what it ran before.
struct Noop final : torch::autograd::Node {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& /*grads*/) override { return {}; }
};

// torch 2.13 holds autograd nodes by intrusive_ptr, earlier releases by shared_ptr: make one of whichever
// kind an Edge holds.
template <typename T>
auto make_node() {
  using Held = decltype(torch::autograd::Edge::function);
  if constexpr (std::is_same_v<Held, std::shared_ptr<torch::autograd::Node>>) return std::make_shared<T>();
  else return c10::make_intrusive<T>();
}

// A backward pass through one Noop per device index, each on its device's worker thread. Runs on a thread
// of its own: its GraphTask captures that thread's empty thread-local state, so no Python object.
void run_noops(int32_t devices) {
  auto& engine = torch::autograd::Engine::get_default_engine();
  for (int32_t index = 0; index < devices; ++index) {
    at::Tensor grad = at::empty({0}, at::TensorOptions().device(c10::DeviceType::PrivateUse1, index));
    auto noop = make_node<Noop>();
    noop->add_input_metadata(grad);
    engine.execute({torch::autograd::Edge(noop, 0)}, {grad}, /*keep_graph=*/false, /*create_graph=*/false,
                   /*accumulate_grad=*/true);
  }
}

}  // namespace

void drain_autograd_threads(std::chrono::seconds limit) {
  const int32_t devices = device_count();
  if (devices == 0) return;
  std::packaged_task<void()> task([devices] { run_noops(devices); });
  std::future<void> done = task.get_future();
  std::thread(std::move(task)).detach();  // detached: a worker stuck in a backward must not hold up the exit
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "diopi: an autograd worker thread of the device was still busy %lld s into the exit\n",
                 static_cast<long long>(limit.count()));
    return;
  }
  try {
    done.get();
  } catch (const std::exception& e) {
    // e.g. a child of fork, where the engine refuses to run: it has no worker threads to wait for.
    std::fprintf(stderr, "diopi: the autograd worker threads of the device were not drained at exit: %s\n", e.what());
  }
}

void ensure_autograd_queues() {
  auto& engine = torch::autograd::Engine::get_default_engine();
  engine.initialize_device_threads_pool();  // starts them now, sized with this device, if not yet started
  auto& queues = EngineQueues::of(engine);
  for (auto index = static_cast<int>(queues.size()); index < device_count(); ++index) {
    auto queue = std::make_shared<torch::autograd::ReadyQueue>();
    queues.push_back(queue);
    std::thread worker(&torch::autograd::Engine::thread_init, &engine, index, queue, true);
    worker.detach();
  }
}

}  // namespace diopi_bindings
