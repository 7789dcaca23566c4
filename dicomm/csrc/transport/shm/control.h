// The Unix-domain control socket of a shared-memory pair: doorbells both ways, and EOF when the
// peer process is gone (the kernel closes its end, however it died).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "transport/poller.h"
#include "transport/unique_fd.h"

namespace dicomm::transport::shm {

class ControlSocket {
 public:
  ControlSocket(UniqueFd fd, Poller* poller, std::string what);
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  // Rings the peer if its `sleeping` flag is up (call after publishing).
  void ring_if_sleeping(const std::atomic<uint32_t>& sleeping);
  // Swallows doorbells; false once the peer has closed (EOF or error).
  bool drain();
  const std::string& what() const { return what_; }

 private:
  UniqueFd fd_;
  Poller* poller_;  // not owned: the engine's, which outlives its connections
  std::string what_;
};

}  // namespace dicomm::transport::shm
