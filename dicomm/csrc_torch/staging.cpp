#include "staging.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Logging.h>

#include <mutex>
#include <set>
#include <string>

namespace dicomm::torch_backend {
namespace {

// No silent fallback: say once per device type that its tensors go through host memory.
void announce(c10::DeviceType type) {
  static std::mutex mu;
  static std::set<c10::DeviceType> announced;
  std::lock_guard<std::mutex> lock(mu);
  if (announced.insert(type).second)
    LOG(INFO) << "dicomm: " << c10::DeviceTypeName(type, true)
              << " tensors take the CPU-mediated path (staged through pinned host memory; no "
                 "device-direct transport for them yet)";
}

at::Tensor pinned_like(const at::Tensor& t) {
  try {
    return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  } catch (const c10::Error&) {  // no runtime able to pin host memory: pageable still works
    return at::empty(t.sizes(), t.options().device(at::kCPU));
  }
}

}  // namespace

void Stager::use_stream_of(const at::Tensor& t) {
  if (stream_) return;
  announce(t.device().type());
  c10::impl::VirtualGuardImpl impl(t.device().type());
  stream_ = impl.getStream(t.device());
}

at::Tensor Stager::input(const at::Tensor& t) {
  if (t.is_cpu()) return t.is_contiguous() ? t : t.contiguous();
  use_stream_of(t);
  at::Tensor host = pinned_like(t);
  host.copy_(t, /*non_blocking=*/true);
  pending_sync_ = true;
  return host;
}

at::Tensor Stager::output(const at::Tensor& t, bool inout) {
  if (t.is_cpu() && t.is_contiguous()) return t;
  at::Tensor host;
  if (inout) host = input(t);
  else if (t.is_cpu()) host = at::empty(t.sizes(), t.options());
  else {
    use_stream_of(t);
    host = pinned_like(t);
  }
  back_.emplace_back(t, host);
  return host;
}

void Stager::ready() {
  if (pending_sync_) {
    stream_->synchronize();
    pending_sync_ = false;
  }
}

void Stager::finish() {
  if (!stream_) {
    for (auto& [t, host] : back_) t.copy_(host);
  } else {
    c10::StreamGuard guard(*stream_);
    for (auto& [t, host] : back_) t.copy_(host, /*non_blocking=*/!t.is_cpu());
  }
  back_.clear();
}

}  // namespace dicomm::torch_backend
