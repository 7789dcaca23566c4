// Threads that complete Work futures.
//
// A future's callbacks run on the thread that completes it, and a callback may issue another
// operation and wait for its future (PowerSGD does). So no completion may queue behind a busy
// one: each task gets a thread that is idle at that moment, started on demand; threads left idle
// for a while exit.
#pragma once

#include <functional>

namespace dicomm::torch_backend {

void run_on_completer(std::function<void()> task);

}  // namespace dicomm::torch_backend
