// The CPU-mediated path: buffers the NIC cannot register (device memory without dma-buf or a
// peer-memory module) move through registered host memory. The receiver reads each chunk into a
// slot of a staging ring and copies it to the destination while later chunks are still on the
// wire; the sender copies its buffer into one registered host buffer chunk by chunk, announcing the
// first chunk with the message and each later one as it lands (kReady), so its copy-in overlaps the
// receiver's reads.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "transport/verbs/nic.h"
#include "transport/verbs/owned.h"

namespace dicomm::transport::verbs {

// Registered, page-aligned host memory.
class HostBuffer {
 public:
  HostBuffer(Nic& nic, size_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  char* data() const { return data_.get(); }
  size_t size() const { return bytes_; }
  uint32_t lkey() const;
  uint32_t rkey() const;

 private:
  AlignedMemory data_;  // first: the registration goes before the memory
  size_t bytes_;
  OwnedMr mr_;
};

class StagingRing {
 public:
  StagingRing(Nic& nic, size_t chunk, int slots);
  int take();  // -1 when all slots are in flight
  void give(int slot) { free_.push_back(slot); }
  char* slot(int i) const { return buf_.data() + static_cast<size_t>(i) * chunk_; }
  uint32_t lkey() const { return buf_.lkey(); }

 private:
  HostBuffer buf_;
  size_t chunk_;
  std::vector<int> free_;
};

// Copies between a staging buffer and user memory (device memory through the vendor runtime).
void copy_out(void* dst, const void* host_src, size_t n, bool dst_device);
void copy_in(void* host_dst, const void* src, size_t n, bool src_device);

}  // namespace dicomm::transport::verbs
