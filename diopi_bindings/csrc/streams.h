// Streams and events of the device, when the library exports diopi_stream_* and diopi_event_* (diopirt.h):
// per device a default stream (id 0) and a pool of kPoolSize more, created in the library on first use and
// kept for the process; each thread has its current stream per device (c10's contract). Without them the
// library's operators complete before they return: every stream is id 0 with a NULL handle, events are
// complete when recorded.
#pragma once

#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

namespace diopi_bindings {

constexpr c10::StreamId kPoolSize = 8;

bool has_streams() noexcept;
// The library's handle of stream `id` of `device` (created on first use); NULL without streams.
void* stream_handle(c10::DeviceIndex device, c10::StreamId id);
c10::StreamId current_stream_id(c10::DeviceIndex device) noexcept;
void set_current_stream_id(c10::DeviceIndex device, c10::StreamId id);
c10::StreamId next_pool_stream(c10::DeviceIndex device);  // round robin over the pool
void synchronize_stream(c10::DeviceIndex device, c10::StreamId id);
bool query_stream(c10::DeviceIndex device, c10::StreamId id);
// Before the host touches device memory synchronously: the calling thread's current stream of `device`.
void synchronize_current_stream(c10::DeviceIndex device);

// Events: created by the first record, on the recording stream's device.
struct Event {
  c10::DeviceIndex device;
  void* handle;
};
void record_event(void** event, c10::DeviceIndex device, c10::StreamId stream);
void wait_event(void* event, c10::DeviceIndex device, c10::StreamId stream);
bool query_event(void* event);
void synchronize_event(void* event);
void destroy_event(void* event) noexcept;

// A non-blocking copy queued on the current stream: the host memory `keep` is held until the stream
// reaches the copy (then dropped at a later async copy or a synchronization).
void copy_h2d_async(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes, c10::Storage keep);
void copy_d2h_async(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes, c10::Storage keep);

}  // namespace diopi_bindings
