// Device memory from the library: each block remembers the device it was allocated on, which its
// free must name (the reference library refuses anything else).
#include <c10/core/DeviceGuard.h>

#include <cstdio>

#include "device.h"
#include "runtime.h"

namespace ditorch_diopi {

namespace {

struct Block {
  void* ptr;
  c10::DeviceIndex device;
};

// A deleter must not throw: a refused free is reported, not raised.
void free_block(void* context) {
  auto* block = static_cast<Block*>(context);
  if (attached()) {
    const diopiError_t code = runtime().device_free(block->device, block->ptr);
    if (code != DIOPI_SUCCESS) {
      const char* message = runtime().last_error ? runtime().last_error() : "";
      std::fprintf(stderr, "diopi: diopi_device_free failed (error %d): %s\n", static_cast<int>(code),
                   message ? message : "");
    }
  }
  delete block;
}

class DeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    void* ptr = nullptr;
    check(runtime().device_malloc(device, static_cast<int64_t>(nbytes), &ptr), "diopi_device_malloc");
    return {ptr, new Block{ptr, device}, &free_block, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    const c10::DeviceIndex device = current_device();
    copy_d2d(device, dest, device, src, static_cast<int64_t>(count));
  }
};

DeviceAllocator allocator_;

}  // namespace

c10::Allocator* device_allocator() { return &allocator_; }

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "diopi: cannot resize a storage that is not resizable");
  const size_t old = storage.nbytes();
  if (nbytes == old) return;
  const c10::Device device = storage.device();
  c10::DeviceGuard guard(device);
  c10::DataPtr fresh = allocator_.allocate(nbytes);
  const size_t keep = std::min(old, nbytes);
  if (keep > 0)
    copy_d2d(device.index(), fresh.get(), device.index(), storage.data_ptr().get(), static_cast<int64_t>(keep));
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(nbytes);
}

}  // namespace ditorch_diopi
