#include "transport/verbs/staging.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/types.h"
#include "transport/verbs/accel.h"

namespace dicomm::transport::verbs {

HostBuffer::HostBuffer(Nic& nic, size_t bytes) : bytes_(bytes), mr_(nullptr, {&nic.api()}) {
  size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  data_.reset(static_cast<char*>(std::aligned_alloc(4096, rounded)));
  if (!data_) throw Error("verbs: cannot allocate " + std::to_string(rounded) + " B of staging memory");
  mr_.reset(nic.api().reg_mr(nic.pd(), data_.get(), rounded, ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_READ));
  if (!mr_)
    throw Error("verbs: registering " + std::to_string(rounded) + " B of staging memory with " + nic.port().describe() +
                " failed: " + std::strerror(errno));
}

HostBuffer::~HostBuffer() = default;  // the registration, then the memory

uint32_t HostBuffer::lkey() const { return mr_->lkey; }
uint32_t HostBuffer::rkey() const { return mr_->rkey; }

StagingRing::StagingRing(Nic& nic, size_t chunk, int slots) : buf_(nic, chunk * static_cast<size_t>(slots)), chunk_(chunk) {
  for (int i = slots - 1; i >= 0; --i) free_.push_back(i);
}

int StagingRing::take() {
  if (free_.empty()) return -1;
  int s = free_.back();
  free_.pop_back();
  return s;
}

void copy_out(void* dst, const void* src, size_t n, bool dst_device) {
  if (dst_device) Accel::get().copy_to_device(dst, src, n);
  else std::memcpy(dst, src, n);
}

void copy_in(void* dst, const void* src, size_t n, bool src_device) {
  if (src_device) Accel::get().copy_to_host(dst, src, n);
  else std::memcpy(dst, src, n);
}

}  // namespace dicomm::transport::verbs
