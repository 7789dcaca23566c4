// The pieces that make PrivateUse1 a device over a DIOPI library, registered by attach (module.cpp):
// a caching allocator whose memory comes from diopi_device_malloc, a device guard, hooks with one default
// generator per device, and the memory kernels (empty, views, resize_, set_, copies).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <chrono>

namespace diopi_bindings {

c10::Allocator* device_allocator();  // a caching allocator (allocator.cpp)
// Off: the cache is emptied and every later free goes straight to the library.
void set_caching(bool on);
// Gives every cached block back to the library.
void empty_cache();
// Grows a storage of this device to `nbytes`, keeping its bytes (resize_, set_).
void resize_storage(const c10::Storage& storage, size_t nbytes);

// Tensor copies of the device so far (_copy_from and .item()), by direction.
enum CopyKind { kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2, kItem = 3 };
int64_t copy_count(CopyKind kind);

void register_guard();
void register_hooks();
void register_kernels();
// After attach: autograd worker queues for every device, even if the engine started before (autograd_queues.cpp).
void ensure_autograd_queues();
// Waits (at most `limit`, then says so on stderr) until every autograd worker thread of the device has
// finished what it ran and released it (autograd_queues.cpp). Called at exit, with the GIL released.
void drain_autograd_threads(std::chrono::seconds limit);

}  // namespace diopi_bindings
