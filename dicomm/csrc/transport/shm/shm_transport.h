// Shared-memory transport for peers on the same host. Each directed pair has a segment created by
// the sender and handed to the receiver as a file descriptor over an abstract Unix socket (no
// name in /dev/shm, so nothing leaks when a process dies); that socket stays open for doorbells
// and to notice the peer's death.
#pragma once

#include <memory>

#include "transport/acceptor.h"
#include "transport/shm/shm_conn.h"
#include "transport/transport.h"

namespace dicomm::transport::shm {

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(const Context& ctx);
  const char* name() const override { return "shm"; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string address() const override { return address_; }
  bool can_reach(const Card& self, const Card& peer, std::string* why) const override;
  std::unique_ptr<SendConn> connect(int peer, const Card& card, Clock::time_point deadline) override;
  bool progress() override;
  void add_stats(std::map<std::string, int64_t>& out, const std::vector<std::string>& paths) const override;

 private:
  Context ctx_;
  Capabilities caps_;
  std::shared_ptr<ShmCounters> counters_ = std::make_shared<ShmCounters>();  // shared with its send connections
  std::string address_;  // abstract socket name, without the leading NUL
  bool cma_allowed_;     // DICOMM_SHM_CMA=0 turns single-copy off (tests the pipeline)
  std::unique_ptr<Acceptor> acceptor_;
};

}  // namespace dicomm::transport::shm
