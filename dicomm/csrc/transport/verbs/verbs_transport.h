// RDMA verbs transport: RC queue pairs on one RDMA port (the first active one DICOMM_IB_HCA
// allows). Each connection starts on a TCP side channel to the peer's published address: the
// handshake (core/handshake.h), then both sides' connection data (QPN, PSN, GID, MTU, credit word and rkey);
// the side channel then stays open to notice the peer's death at once.
#pragma once

#include <memory>
#include <string>

#include "transport/acceptor.h"
#include "transport/unique_fd.h"
#include "transport/transport.h"
#include "transport/verbs/nic.h"

namespace dicomm::transport::verbs {

constexpr uint16_t kVerbsTransportId = static_cast<uint16_t>(TransportId::kVerbs);  // the hello's transport field

class VerbsTransport : public Transport {
 public:
  // Null, with `why` set, when this host has no usable RDMA port (no rdma-core, no device, all
  // ports down, or none allowed by DICOMM_IB_HCA). Throws ValueError on a bad setting.
  static std::unique_ptr<VerbsTransport> create(const Context& ctx, std::string* why);
  ~VerbsTransport() override;

  const char* name() const override { return "verbs"; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string address() const override { return address_; }
  bool can_reach(const Card& self, const Card& peer, std::string* why) const override;
  std::unique_ptr<SendConn> connect(int peer, const Card& card, Clock::time_point deadline) override;
  bool progress() override;
  std::string describe_path(const SendConn* send, const std::vector<std::shared_ptr<RecvConn>>& recv) const override;
  void add_stats(std::map<std::string, int64_t>& out, const std::vector<std::string>& paths) const override;
  Nic& nic() const { return *nic_; }

 private:
  VerbsTransport(const Context& ctx, std::shared_ptr<Nic> nic, const std::string& ip);
  // Takes `fd`, the side channel (closed with the channel, or at once if opening it fails).
  std::unique_ptr<class Channel> open_channel(int peer, UniqueFd fd, bool outgoing);

  Context ctx_;
  Capabilities caps_;
  std::shared_ptr<Nic> nic_;
  std::string address_;  // ip:port of the side channel, then "/device:port"
  std::unique_ptr<Acceptor> acceptor_;
  size_t chunk_bytes_;
};

}  // namespace dicomm::transport::verbs
