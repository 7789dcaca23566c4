// The device-memory functions of a DIOPI library (diopirt.h), as the C++ device calls them. Python
// loads the library and hands over the function pointers (attach); every call checks its error code
// and turns a failure into a c10::Error carrying the library's message.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "diopi/diopirt.h"

namespace diopi_bindings {

struct RuntimeTable {
  diopiError_t (*device_count)(int32_t*) = nullptr;
  diopiError_t (*set_device)(int32_t) = nullptr;
  diopiError_t (*get_device)(int32_t*) = nullptr;
  diopiError_t (*device_malloc)(int32_t, int64_t, void**) = nullptr;
  diopiError_t (*device_free)(int32_t, void*) = nullptr;
  diopiError_t (*memcpy_h2d)(int32_t, void*, const void*, int64_t) = nullptr;
  diopiError_t (*memcpy_d2h)(int32_t, void*, const void*, int64_t) = nullptr;
  diopiError_t (*memcpy_d2d)(int32_t, void*, int32_t, const void*, int64_t) = nullptr;
  diopiError_t (*device_synchronize)(int32_t) = nullptr;
  const char* (*last_error)() = nullptr;
  // Streams and events: all set, or all null (a library whose operators complete before they return).
  diopiError_t (*stream_create)(int32_t, void**) = nullptr;
  diopiError_t (*stream_destroy)(int32_t, void*) = nullptr;
  diopiError_t (*stream_synchronize)(int32_t, void*) = nullptr;
  diopiError_t (*stream_query)(int32_t, void*, int32_t*) = nullptr;
  diopiError_t (*memcpy_h2d_async)(int32_t, void*, const void*, int64_t, void*) = nullptr;
  diopiError_t (*memcpy_d2h_async)(int32_t, void*, const void*, int64_t, void*) = nullptr;
  diopiError_t (*event_create)(int32_t, void**) = nullptr;
  diopiError_t (*event_destroy)(int32_t, void*) = nullptr;
  diopiError_t (*event_record)(int32_t, void*, void*) = nullptr;
  diopiError_t (*event_query)(int32_t, void*, int32_t*) = nullptr;
  diopiError_t (*event_synchronize)(int32_t, void*) = nullptr;
  diopiError_t (*stream_wait_event)(int32_t, void*, void*) = nullptr;
};

// The attached library's table; throws if none is attached.
const RuntimeTable& runtime();
bool attached();
void attach(const RuntimeTable& table, int32_t device_count);
int32_t device_count() noexcept;  // 0 before attach

// Throws a c10::Error naming the call and the library's message when `code` is not success.
void check(diopiError_t code, const char* call);

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
void check_index(c10::DeviceIndex index);

// Copies through the library (nbytes may be 0), after the current stream of the devices involved
// reached the copy (streams.cpp): the host sees the work queued before.
void copy_h2d(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes);
void copy_d2h(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes);
void copy_d2d(c10::DeviceIndex dst_device, void* dst, c10::DeviceIndex src_device, const void* src, int64_t nbytes);

}  // namespace diopi_bindings
