#include "runtime.h"

#include "streams.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace diopi_bindings {

namespace {
RuntimeTable table_;
std::atomic<int32_t> count_{0};
}  // namespace

const RuntimeTable& runtime() {
  TORCH_CHECK(count_.load() > 0, "the diopi device is not enabled: call diopi_bindings.device.enable() first");
  return table_;
}

bool attached() { return count_.load() > 0; }

void attach(const RuntimeTable& table, int32_t device_count) {
  TORCH_CHECK(!attached(), "a DIOPI library is already attached to the diopi device in this process");
  TORCH_CHECK(device_count > 0 && device_count <= 64, "the DIOPI library reports ", device_count,
              " devices; expected 1 to 64");
  table_ = table;
  count_.store(device_count);
}

int32_t device_count() noexcept { return count_.load(); }

void check(diopiError_t code, const char* call) {
  if (code == DIOPI_SUCCESS) return;
  const char* message = table_.last_error ? table_.last_error() : "";
  TORCH_CHECK(false, "diopi: ", call, " failed (error ", static_cast<int>(code), "): ",
              (message && *message) ? message : "no message");
}

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "diopi device index ", static_cast<int>(index),
              " out of range: this host has ", device_count(), " diopi device(s)");
}

c10::DeviceIndex current_device() {
  int32_t d = 0;
  check(runtime().get_device(&d), "diopi_get_device");
  return static_cast<c10::DeviceIndex>(d);
}

void set_current_device(c10::DeviceIndex index) {
  check_index(index);
  check(runtime().set_device(index), "diopi_set_device");
}

void copy_h2d(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  synchronize_current_stream(device);
  check(runtime().memcpy_h2d(device, dst, src, nbytes), "diopi_memcpy_h2d");
}

void copy_d2h(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  synchronize_current_stream(device);
  check(runtime().memcpy_d2h(device, dst, src, nbytes), "diopi_memcpy_d2h");
}

void copy_d2d(c10::DeviceIndex dst_device, void* dst, c10::DeviceIndex src_device, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  synchronize_current_stream(src_device);
  if (dst_device != src_device) synchronize_current_stream(dst_device);
  check(runtime().memcpy_d2d(dst_device, dst, src_device, src, nbytes), "diopi_memcpy_d2d");
}

}  // namespace diopi_bindings
