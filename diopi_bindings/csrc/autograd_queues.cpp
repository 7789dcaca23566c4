// Enabling the device after the process already ran a backward pass. The autograd engine sizes its
// per-device ready queues (one worker thread per device index) once, at its first backward, from the
// device guards registered then; a device registered later would find no queue for its index. After
// attach, this gives the engine the queues and worker threads it would have started had the device
// existed then, the way Engine::start_device_threads does. Called while no backward pass runs.
#include <torch/csrc/autograd/engine.h>

#include <memory>
#include <thread>
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

}  // namespace

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
