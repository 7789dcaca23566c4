// The vendor's own device model, shared by its runtime (runtime.cpp, the project's device-memory ABI) and
// its operators (ops.cpp, DeepLink's DIOPI): a stream is a queue of work that a worker thread runs in order,
// later than the call that queued it. While the test holds the device (asyncvendor_hold(1)) the workers run
// nothing until someone synchronizes, so whatever the host reads without synchronizing is stale for sure.
#pragma once

#include <cstdint>
#include <functional>

namespace asyncvendor {

void enqueue(void* stream, std::function<void()> work);  // stream: a handle from diopi_stream_create
bool is_device_memory(const void* ptr, int64_t nbytes);  // inside a block of diopi_device_malloc

}  // namespace asyncvendor
