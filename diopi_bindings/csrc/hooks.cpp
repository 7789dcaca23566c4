// PrivateUse1 hooks: availability, device count, and one default generator per device. A device
// generator is the CPU generator's algorithm (mt19937 + the same seeding) tagged with this device:
// random operators run on the CPU with its state (router.py), so a seed gives the CPU's stream.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <mutex>
#include <vector>

#include "device.h"
#include "runtime.h"

namespace diopi_bindings {

namespace {

class DeviceGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit DeviceGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  const c10::DeviceIndex chosen = index < 0 ? current_device() : index;
  check_index(chosen);
  return chosen;
}

at::Generator new_generator(c10::DeviceIndex index) { return at::make_generator<DeviceGenerator>(resolve(index)); }

struct DeviceHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return attached(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return attached(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex old = current_device();
    if (device != old) set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    static std::once_flag once;
    static std::vector<at::Generator> generators;
    std::call_once(once, [] {
      for (int32_t i = 0; i < device_count(); ++i) generators.push_back(new_generator(static_cast<c10::DeviceIndex>(i)));
    });
    return generators.at(static_cast<size_t>(resolve(index)));
  }

  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }

  at::Device getDeviceFromPtr(void*) const override {
    TORCH_CHECK(false, "diopi: device tensors from foreign pointers (from_blob) are not supported");
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage(storage, nbytes);
  }
};

}  // namespace

void register_hooks() {
  static DeviceHooks* hooks = new DeviceHooks();
  at::RegisterPrivateUse1HooksInterface(hooks);
}

}  // namespace diopi_bindings
