// TCP transport: peers on other hosts (or any peer when forced). Listens on DICOMM_SOCKET_IFNAME's
// address, else the host's primary address, else loopback; DICOMM_TCP_STREAMS sockets per peer.
#pragma once

#include <map>
#include <memory>

#include "transport/acceptor.h"
#include "transport/tcp/tcp_conn.h"
#include "transport/transport.h"

namespace dicomm::transport::tcp {

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const Context& ctx);
  const char* name() const override { return "tcp"; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string address() const override { return address_; }
  bool can_reach(const Card& self, const Card& peer, std::string* why) const override;
  std::unique_ptr<SendConn> connect(int peer, const Card& card, Clock::time_point deadline) override;
  bool progress() override;

 private:
  Context ctx_;
  Capabilities caps_;
  std::string address_;
  int nstreams_;
  size_t chunk_bytes_;
  std::unique_ptr<Acceptor> acceptor_;
  // By source rank and connecting process (0: another host), while streams arrive: streams from
  // another process of this host make a connection of their own, which the engine holds to the
  // rank's card (an impostor that came first must not lock the rank itself out).
  std::map<std::pair<int, int64_t>, std::weak_ptr<TcpRecvConn>> recv_conns_;
};

}  // namespace dicomm::transport::tcp
