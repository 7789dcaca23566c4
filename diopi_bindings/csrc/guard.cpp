// The device guard: the current device is the library's (diopi_set_device/get_device). The library's
// operators complete before they return, so there is one stream per device and events are no-ops.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <memory>

#include "device.h"
#include "runtime.h"

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

  c10::Stream getStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream getDefaultStream(c10::Device device) const override { return c10::Stream(c10::Stream::DEFAULT, device); }
  c10::Stream exchangeStream(c10::Stream stream) const override { return c10::Stream(c10::Stream::DEFAULT, stream.device()); }

  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count()); }

  // Synchronous operators: an event is recorded as soon as it is asked for.
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    *event = nullptr;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override { synchronizeDevice(stream.device_index()); }
  void synchronizeEvent(void*) const override {}
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
