// PrivateUse1 hooks: availability, device count, and one default generator per device. A device
// generator is the CPU generator's algorithm (mt19937 + the same seeding) tagged with this device, so a
// seed gives the CPU's stream to random operators run on the CPU with its state (router.py), plus the
// (seed, offset) counter that DIOPI random functions draw by.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "device.h"
#include "runtime.h"

namespace diopi_bindings {

namespace {

// Two streams of numbers under one seed: the CPU algorithm's state, for random operators run on the CPU
// with this generator's state (router.py), and a counter (offset) that DIOPI random functions draw by
// (diopiGeneratorGetSeedAndOffset/SetSeedAndOffset). Seeding resets both; the state tensor is the CPU
// layout followed by the offset (8 bytes), and a CPU-sized state sets the CPU part only.
class DeviceGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit DeviceGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
  void set_current_seed(uint64_t seed) override {
    at::CPUGeneratorImpl::set_current_seed(seed);
    offset_ = 0;
  }
  uint64_t seed() override {
    offset_ = 0;
    return at::CPUGeneratorImpl::seed();
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    const at::Tensor cpu(at::CPUGeneratorImpl::get_state());
    at::Tensor state = at::empty({cpu.numel() + kOffsetBytes}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(state.data_ptr(), cpu.const_data_ptr(), static_cast<size_t>(cpu.numel()));
    std::memcpy(static_cast<uint8_t*>(state.data_ptr()) + cpu.numel(), &offset_, kOffsetBytes);
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    static const int64_t cpu_bytes = at::Tensor(at::CPUGeneratorImpl().get_state()).numel();
    const int64_t n = new_state.numel();
    TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && (n == cpu_bytes || n == cpu_bytes + kOffsetBytes),
                "diopi: a generator state is ", cpu_bytes + kOffsetBytes, " bytes (uint8), or ", cpu_bytes,
                " for the CPU part alone; got ", n);
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    at::Tensor cpu = at::empty({cpu_bytes}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(cpu.data_ptr(), bytes, static_cast<size_t>(cpu_bytes));
    at::CPUGeneratorImpl::set_state(*cpu.unsafeGetTensorImpl());
    if (n == cpu_bytes + kOffsetBytes) std::memcpy(&offset_, bytes + cpu_bytes, kOffsetBytes);
  }

 private:
  static constexpr int64_t kOffsetBytes = sizeof(uint64_t);
  DeviceGenerator* clone_impl() const override {
    auto* copy = new DeviceGenerator(device_.index());
    copy->set_state(*get_state());
    return copy;
  }
  uint64_t offset_ = 0;
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

  // "Pinned" host memory (what a non_blocking copy to the host allocates) is plain host memory: the
  // runtime's async copies take any host pointer, and the framework keeps it alive until the copy ran.
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetAllocator(c10::DeviceType::CPU); }
  bool isPinnedPtr(const void*) const override { return false; }

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
