// Accelerator memory seen from the NIC (the H2 paper's device-direct vs CPU-mediated paths).
// The vendor runtime (CUDA's driver API here) is loaded with dlopen; without it every buffer is
// host memory. Which registration methods work is probed once, on the first device buffer:
//   1. dma-buf: the driver exports the allocation as a dma-buf fd, ibv_reg_dmabuf_mr maps it;
//   2. peer memory: plain ibv_reg_mr on the device pointer (works with nvidia-peermem loaded);
//   3. neither: the CPU-mediated path stages through registered host buffers.
#pragma once

#include <cstddef>
#include <string>

#include "transport/verbs/ibv_api.h"

namespace dicomm::transport::verbs {

enum class DevicePath { kUnprobed, kDmabuf, kPeerMemory, kCpuMediated };
const char* device_path_name(DevicePath p);  // "device-direct (dma-buf)", ...

// What the probe found; the decision below is a pure function of it (unit-testable anywhere).
struct AccelCaps {
  bool driver = false;          // the vendor driver library loaded and initialised
  std::string driver_why;       // "no CUDA driver (libcuda.so.1: cannot open ...)" when not
  bool dmabuf_export = false;   // the driver can export dma-buf fds
  bool ibv_dmabuf = false;      // libibverbs has ibv_reg_dmabuf_mr
  bool dmabuf_works = false;    // a probe registration through dma-buf succeeded
  bool peermem_works = false;   // a probe ibv_reg_mr on device memory succeeded
};
DevicePath decide_path(const AccelCaps& caps, std::string* why);

class Accel {
 public:
  static Accel& get();  // loads the driver once
  const AccelCaps& caps() const { return caps_; }
  bool is_device(const void* p) const;
  // Exports [p, p+n) as a dma-buf: fd (caller closes) and the offset of p inside it; -1 if not.
  int export_dmabuf(const void* p, size_t n, uint64_t* offset) const;
  void copy_to_host(void* dst, const void* src_device, size_t n) const;
  void copy_to_device(void* dst_device, const void* src, size_t n) const;
  // Probes registration on `pd` with the device buffer `p` (once per process) and decides.
  DevicePath probe(const IbvApi& api, ibv::pd* pd, const void* p, size_t n, std::string* why);

 private:
  Accel();
  AccelCaps caps_;
  DevicePath path_ = DevicePath::kUnprobed;
  std::string path_why_;
  struct Fns;
  class ContextScope;
  Fns* fns_ = nullptr;  // the loaded runtime's entry points, never unloaded
};

}  // namespace dicomm::transport::verbs
