// The device guard: the current device is the library's (diopi_set_device/get_device); streams and events
// are the library's when it exports them (streams.cpp), else one stream per device and complete events.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <memory>

#include "device.h"
#include "runtime.h"
#include "streams.h"

namespace diopi_bindings {

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

struct DeviceGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    if (old.index() != device.index()) setDevice(device);
    return old;
  }

  c10::Device getDevice() const override { return {kType, current_device()}; }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kType, "diopi: expected a diopi device, got ", device);
    set_current_device(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (attached() && device.index() >= 0 && device.index() < device_count()) (void)runtime().set_device(device.index());
  }

  // Streams are the library's (streams.cpp): id 0 the default, 1..kPoolSize a pool.
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, current_stream_id(device.index()));
  }
  c10::Stream getDefaultStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, next_pool_stream(device.index()));
  }
  c10::Stream getNewStream(c10::Device device, int) const override { return getStreamFromGlobalPool(device, false); }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Stream old = getStream(stream.device());
    set_current_stream_id(stream.device_index(), stream.id());
    return old;
  }
  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return stream_handle(stream.device_index(), stream.id());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count()); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override {
    record_event(event, stream.device_index(), stream.id());
  }
  void block(void* event, const c10::Stream& stream) const override {
    wait_event(event, stream.device_index(), stream.id());
  }
  bool queryEvent(void* event) const override { return query_event(event); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { destroy_event(event); }
  bool queryStream(const c10::Stream& stream) const override { return query_stream(stream.device_index(), stream.id()); }
  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize_stream(stream.device_index(), stream.id());
  }
  void synchronizeEvent(void* event) const override { synchronize_event(event); }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    check_index(index);
    check(runtime().device_synchronize(index), "diopi_device_synchronize");
  }
};

}  // namespace

void register_guard() {
  static c10::impl::DeviceGuardImplRegistrar registrar(kType, new DeviceGuardImpl());
}

}  // namespace diopi_bindings
