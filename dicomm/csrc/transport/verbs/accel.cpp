#include "transport/verbs/accel.h"

#include <cstring>
#include <dlfcn.h>
#include <map>
#include <mutex>
#include <unistd.h>

#include "core/types.h"

namespace dicomm::transport::verbs {

// The few CUDA driver API entry points used (stable C ABI of libcuda.so.1).
struct Accel::Fns {
  int (*cuInit)(unsigned);
  int (*cuPointerGetAttribute)(void* data, int attribute, unsigned long long ptr);
  int (*cuMemGetAddressRange)(unsigned long long* base, size_t* size, unsigned long long ptr);
  int (*cuMemGetHandleForAddressRange)(void* handle, unsigned long long ptr, size_t size, int type, unsigned long long flags);
  int (*cuMemcpyDtoH)(void* dst, unsigned long long src, size_t n);
  int (*cuMemcpyHtoD)(unsigned long long dst, const void* src, size_t n);
  int (*cuCtxPushCurrent)(void* ctx);
  int (*cuCtxPopCurrent)(void** ctx);
  int (*cuDeviceGet)(int* dev, int ordinal);
  int (*cuDevicePrimaryCtxRetain)(void** ctx, int dev);
  // Primary contexts retained so far, by device ordinal: retained once and kept for the process's life
  // (they outlive every buffer), not once per copy.
  std::mutex primary_mu;
  std::map<int, void*> primary;
  void* primary_context(int ordinal) {
    std::lock_guard<std::mutex> lock(primary_mu);
    auto it = primary.find(ordinal);
    if (it != primary.end()) return it->second;
    int dev = 0;
    void* ctx = nullptr;
    if (cuDeviceGet(&dev, ordinal) != 0 || cuDevicePrimaryCtxRetain(&ctx, dev) != 0) return nullptr;
    return primary[ordinal] = ctx;
  }
};

namespace {
constexpr int kPointerAttributeContext = 1;     // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kPointerAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeOrdinal = 9;     // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kMemoryTypeDevice = 2;            // CU_MEMORYTYPE_DEVICE
constexpr int kRangeHandleDmabufFd = 1;         // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr int kAccess = ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_READ | ibv::ACCESS_REMOTE_WRITE;
}  // namespace

const char* device_path_name(DevicePath p) {
  switch (p) {
    case DevicePath::kDmabuf: return "device-direct (dma-buf)";
    case DevicePath::kPeerMemory: return "device-direct (peer memory)";
    case DevicePath::kCpuMediated: return "cpu-mediated";
    default: return "unprobed";
  }
}

DevicePath decide_path(const AccelCaps& c, std::string* why) {
  std::string w;
  DevicePath p;
  if (!c.driver) {
    p = DevicePath::kCpuMediated;
    w = c.driver_why.empty() ? "no accelerator driver" : c.driver_why;
  } else if (c.dmabuf_works) {
    p = DevicePath::kDmabuf;
    w = "the NIC maps device memory through a dma-buf exported by the driver";
  } else if (c.peermem_works) {
    p = DevicePath::kPeerMemory;
    w = std::string("dma-buf unavailable (") +
        (!c.dmabuf_export ? "the driver cannot export dma-buf" : !c.ibv_dmabuf ? "libibverbs lacks ibv_reg_dmabuf_mr"
                                                                               : "registration failed") +
        "); ibv_reg_mr on device memory works (peer-memory module)";
  } else {
    p = DevicePath::kCpuMediated;
    w = std::string("the NIC cannot register device memory (") +
        (c.dmabuf_export && c.ibv_dmabuf ? "dma-buf registration failed" : "no dma-buf support") +
        ", no peer-memory module): staging through registered host buffers";
  }
  if (why) *why = w;
  return p;
}

Accel& Accel::get() {
  static Accel a;
  return a;
}

Accel::Accel() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    caps_.driver_why = std::string("no CUDA driver (libcuda.so.1: ") + (e ? e : "not found") + ")";
    return;
  }
  auto* f = new Fns{};
  f->cuInit = reinterpret_cast<decltype(f->cuInit)>(dlsym(lib, "cuInit"));
  f->cuPointerGetAttribute = reinterpret_cast<decltype(f->cuPointerGetAttribute)>(dlsym(lib, "cuPointerGetAttribute"));
  f->cuMemGetAddressRange = reinterpret_cast<decltype(f->cuMemGetAddressRange)>(dlsym(lib, "cuMemGetAddressRange_v2"));
  f->cuMemGetHandleForAddressRange =
      reinterpret_cast<decltype(f->cuMemGetHandleForAddressRange)>(dlsym(lib, "cuMemGetHandleForAddressRange"));
  f->cuMemcpyDtoH = reinterpret_cast<decltype(f->cuMemcpyDtoH)>(dlsym(lib, "cuMemcpyDtoH_v2"));
  f->cuMemcpyHtoD = reinterpret_cast<decltype(f->cuMemcpyHtoD)>(dlsym(lib, "cuMemcpyHtoD_v2"));
  f->cuCtxPushCurrent = reinterpret_cast<decltype(f->cuCtxPushCurrent)>(dlsym(lib, "cuCtxPushCurrent_v2"));
  f->cuCtxPopCurrent = reinterpret_cast<decltype(f->cuCtxPopCurrent)>(dlsym(lib, "cuCtxPopCurrent_v2"));
  f->cuDeviceGet = reinterpret_cast<decltype(f->cuDeviceGet)>(dlsym(lib, "cuDeviceGet"));
  f->cuDevicePrimaryCtxRetain =
      reinterpret_cast<decltype(f->cuDevicePrimaryCtxRetain)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  if (!f->cuInit || !f->cuPointerGetAttribute || !f->cuMemcpyDtoH || !f->cuMemcpyHtoD || !f->cuCtxPushCurrent ||
      !f->cuCtxPopCurrent || !f->cuDeviceGet || !f->cuDevicePrimaryCtxRetain || f->cuInit(0) != 0) {
    caps_.driver_why = "CUDA driver present but unusable (cuInit failed or entry points missing)";
    delete f;
    return;
  }
  fns_ = f;
  caps_.driver = true;
  caps_.dmabuf_export = f->cuMemGetHandleForAddressRange && f->cuMemGetAddressRange;
}

bool Accel::is_device(const void* p) const {
  if (!fns_ || !p) return false;
  int type = 0;
  return fns_->cuPointerGetAttribute(&type, kPointerAttributeMemoryType, reinterpret_cast<uintptr_t>(p)) == 0 &&
         type == kMemoryTypeDevice;
}

// The driver API acts on the calling thread's current context, and dicomm copies and registers from its
// progress thread, where the framework never made one current: push the buffer's own context around each
// call. Memory mapped through the virtual-memory API reports no context; its device's primary one serves.
class Accel::ContextScope {
 public:
  ContextScope(Fns* f, const void* p) : f_(f) {
    void* ctx = nullptr;
    auto addr = reinterpret_cast<uintptr_t>(p);
    if (f_->cuPointerGetAttribute(&ctx, kPointerAttributeContext, addr) != 0 || !ctx) {
      int ordinal = -1;
      ctx = f_->cuPointerGetAttribute(&ordinal, kPointerAttributeOrdinal, addr) == 0 ? f_->primary_context(ordinal)
                                                                                      : nullptr;
    }
    pushed_ = ctx && f_->cuCtxPushCurrent(ctx) == 0;
  }
  ~ContextScope() {
    void* old = nullptr;
    if (pushed_) f_->cuCtxPopCurrent(&old);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  Fns* f_;
  bool pushed_ = false;
};

int Accel::export_dmabuf(const void* p, size_t, uint64_t* offset) const {
  if (!fns_ || !caps_.dmabuf_export) return -1;
  ContextScope scope(fns_, p);
  unsigned long long base = 0;
  size_t size = 0;
  // Whole allocations export cleanly (their bounds are aligned); the buffer is an offset inside.
  if (fns_->cuMemGetAddressRange(&base, &size, reinterpret_cast<uintptr_t>(p)) != 0) return -1;
  int fd = -1;
  if (fns_->cuMemGetHandleForAddressRange(&fd, base, size, kRangeHandleDmabufFd, 0) != 0) return -1;
  *offset = reinterpret_cast<uintptr_t>(p) - base;
  return fd;
}

void Accel::copy_to_host(void* dst, const void* src, size_t n) const {
  if (!fns_) throw Error("staging: no accelerator driver to copy device memory with");
  ContextScope scope(fns_, src);
  if (fns_->cuMemcpyDtoH(dst, reinterpret_cast<uintptr_t>(src), n) != 0)
    throw Error("staging: copying " + std::to_string(n) + " B from device memory failed");
}

void Accel::copy_to_device(void* dst, const void* src, size_t n) const {
  if (!fns_) throw Error("staging: no accelerator driver to copy device memory with");
  ContextScope scope(fns_, dst);
  if (fns_->cuMemcpyHtoD(reinterpret_cast<uintptr_t>(dst), src, n) != 0)
    throw Error("staging: copying " + std::to_string(n) + " B to device memory failed");
}

DevicePath Accel::probe(const IbvApi& api, ibv::pd* pd, const void* p, size_t n, std::string* why) {
  if (path_ == DevicePath::kUnprobed) {
    caps_.ibv_dmabuf = api.reg_dmabuf_mr != nullptr;
    if (caps_.driver && caps_.dmabuf_export && caps_.ibv_dmabuf) {
      uint64_t off = 0;
      int fd = export_dmabuf(p, n, &off);
      if (fd >= 0) {
        ibv::mr* mr = api.reg_dmabuf_mr(pd, off, n, reinterpret_cast<uintptr_t>(p), fd, kAccess);
        caps_.dmabuf_works = mr != nullptr;
        if (mr) api.dereg_mr(mr);
        close(fd);
      }
    }
    if (caps_.driver && !caps_.dmabuf_works) {
      ibv::mr* mr = api.reg_mr(pd, const_cast<void*>(p), n, kAccess);
      caps_.peermem_works = mr != nullptr;
      if (mr) api.dereg_mr(mr);
    }
    path_ = decide_path(caps_, &path_why_);
  }
  if (why) *why = path_why_;
  return path_;
}

}  // namespace dicomm::transport::verbs
