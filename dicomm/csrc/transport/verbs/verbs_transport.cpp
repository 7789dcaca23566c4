#include "transport/verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/config.h"
#include "core/log.h"
#include "core/types.h"
#include "transport/registry.h"
#include "transport/socket.h"
#include "transport/verbs/channel.h"
#include "transport/verbs/verbs_conn.h"

namespace dicomm::transport::verbs {
namespace {

TransportId verbs_id() { return static_cast<TransportId>(kVerbsTransportId); }

std::string local_ip_of(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  char text[INET_ADDRSTRLEN] = "";
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace

std::unique_ptr<VerbsTransport> VerbsTransport::create(const Context& ctx, std::string* why) {
  const IbvApi* api = ibv_api(why);
  if (!api) return nullptr;
  auto devices = discover(*api, why);
  if (devices.empty()) return nullptr;
  auto ports = usable_ports(devices, ctx.config->ib_hca);  // throws on a DICOMM_IB_HCA that matches nothing
  if (ports.empty()) {
    if (why) *why = "no RDMA port is active";
    return nullptr;
  }
  const PortInfo& port = ports.front();
  int max_wr = 0, max_rd = 0;
  for (const auto& d : devices)
    if (d.name == port.device) { max_wr = d.max_qp_wr; max_rd = d.max_qp_rd_atom; }
  // The side channel listens on the address of the port's RoCE GID, so it follows the RDMA path.
  std::string ip;
  try {
    int g = choose_gid(port, "", ctx.config->ib_gid_index, nullptr);
    for (const auto& e : port.gids)
      if (e.index == g) ip = e.ipv4;
  } catch (const ValueError&) {
    if (ctx.config->ib_gid_index) throw;
  }
  if (ip.empty()) ip = listen_ip(ctx.config->socket_ifname);  // no GID address: where the tcp transport listens, never the wildcard
  auto nic = std::make_shared<Nic>(*api, port, max_wr, max_rd, *ctx.config);
  return std::unique_ptr<VerbsTransport>(new VerbsTransport(ctx, std::move(nic), ip));
}

VerbsTransport::VerbsTransport(const Context& ctx, std::shared_ptr<Nic> nic, const std::string& ip)
    : ctx_(ctx), nic_(std::move(nic)) {
  caps_.reach = Capabilities::Reach::kAnyHost;
  caps_.preference = 20;  // between hosts, RDMA beats TCP; on one host shared memory beats both
  caps_.register_above = 16 * 1024;  // smaller messages travel eagerly through the bounce slots
  caps_.device_pointers = true;      // device-direct where the NIC can reach the device, else staged
  // Verbs completions are polled in user space, while a wake-up from the completion channel costs an
  // interrupt, a kernel event and a thread wake-up: under QEMU TCG (Soft-RoCE) on a busy host an 8 B
  // half round trip through the Communicator measured 356-409 us (median) with a 100 us spin and
  // 41 us with 1 ms (on a quiet host both about 40 us).
  caps_.spin = ctx.config->verbs_spin;
  caps_.own_flow_control = true;  // receive credits: the sender never overruns the receiver
  chunk_bytes_ = ctx.config->verbs_chunk_bytes;
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  if (fd.get() < 0 || bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd.get(), 1024) != 0) {
    const int err = errno;
    throw Error("verbs transport cannot listen on " + ip + ": " + errno_text(err));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  std::string shown = ip == "0.0.0.0" ? "127.0.0.1" : ip;
  address_ = shown + ":" + std::to_string(ntohs(sa.sin_port)) + "/" + nic_->port().device + ":" +
             std::to_string(nic_->port().port);
  acceptor_ = std::make_unique<Acceptor>(std::move(fd), ctx_, verbs_id());
  ctx_.poller->add(nic_->async_fd());
}

VerbsTransport::~VerbsTransport() {
  if (ctx_.poller) ctx_.poller->remove(nic_->async_fd());
}

bool VerbsTransport::can_reach(const Card&, const Card& peer, std::string* why) const {
  auto it = peer.addresses.find("verbs");
  if (it != peer.addresses.end() && !it->second.empty()) return true;
  if (why) *why = "the peer has no RDMA device (it publishes no verbs address)";
  return false;
}

std::unique_ptr<Channel> VerbsTransport::open_channel(int peer, UniqueFd fd, bool outgoing) {
  std::string what = std::string("verbs connection ") + (outgoing ? "to" : "from") + " rank " + std::to_string(peer);
  std::string local_ip = local_ip_of(fd.get()), why_gid;
  int gid = choose_gid(nic_->port(), local_ip, ctx_.config->ib_gid_index, &why_gid);
  log(LogLevel::kDebug, what + ": " + nic_->port().describe() + " GID index " + std::to_string(gid) + " (" + why_gid + ")");
  return std::make_unique<Channel>(nic_, std::move(fd), gid, what, ctx_.poller, *ctx_.config);
}

std::unique_ptr<SendConn> VerbsTransport::connect(int peer, const Card& card, Clock::time_point deadline) {
  std::string what = "verbs connection to rank " + std::to_string(peer);
  const std::string& addr = card.addresses.at("verbs");
  auto colon = addr.find(':'), slash = addr.find('/');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (colon == std::string::npos || inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1)
    throw PeerError("rank " + std::to_string(peer) + " published a malformed verbs address '" + addr + "'");
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(addr.substr(colon + 1, slash - colon - 1).c_str())));
  UniqueFd owned(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int fd = owned.get();  // the side channel: `owned` until the channel takes it
  if (fd < 0) throw PeerError(what + ": socket(): " + errno_text(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS)
    throw PeerError(what + " (" + addr + "): connect: " + errno_text(errno) + " (is the peer still running?)");
  pollfd p{fd, POLLOUT, 0};
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&p, 1, static_cast<int>(std::max<long>(left, 0))) != 1) err = ETIMEDOUT;
  else getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) throw PeerError(what + " (" + addr + "): connect: " + errno_text(err) + " (is the peer still running?)");
  auto ch = open_channel(peer, std::move(owned), true);
  Hello h;
  h.transport = kVerbsTransportId;
  h.src = ctx_.rank;
  h.dst = peer;
  WireInfo mine = ch->local_info();
  connector_handshake(fd, h, ctx_.key, deadline, what);
  write_all(fd, &mine, sizeof(mine), deadline, what);
  WireInfo theirs;
  read_exact(fd, &theirs, sizeof(theirs), deadline, what);
  ch->connect(theirs);
  return std::make_unique<VerbsSendConn>(peer, std::move(ch), ctx_.sink, chunk_bytes_);
}

bool VerbsTransport::progress() {
  bool did = nic_->poll_events();
  std::vector<Acceptor::Accepted> accepted;
  did |= acceptor_->progress(&accepted);
  for (auto& a : accepted) {
    int src = a.hello.src;
    const int side = a.fd.get();  // the side channel, in `a` until the channel takes it
    std::unique_ptr<Channel> ch;
    try {
      // The connector sends its data right behind the hello: no round trip is awaited here.
      WireInfo theirs;
      const std::string from = "verbs connection from rank " + std::to_string(src);
      read_exact(side, &theirs, sizeof(theirs), Clock::now() + ctx_.handshake_timeout, from);
      if (std::string why = wire_mismatch(theirs, ctx_.config->ib_eager_bytes); !why.empty()) {
        // Answer with our magic, version and eager size only, so that the connector names the mismatch too.
        WireInfo ours;
        ours.eager_bytes = static_cast<uint32_t>(ctx_.config->ib_eager_bytes);
        write_all(side, &ours, sizeof(ours), Clock::now() + ctx_.handshake_timeout, from);
        throw PeerError(from + ": " + why);
      }
      ch = open_channel(src, std::move(a.fd), false);
      ch->connect(theirs);
      WireInfo mine = ch->local_info();
      write_all(side, &mine, sizeof(mine), Clock::now() + ctx_.handshake_timeout, ch->what());
    } catch (const Error& e) {
      ctx_.sink->on_rejected(e.what());
      continue;
    }
    ctx_.sink->on_accept(std::make_shared<VerbsRecvConn>(src, std::move(ch), ctx_.sink, chunk_bytes_));
  }
  return did;
}

std::string VerbsTransport::describe_path(const SendConn* send,
                                         const std::vector<std::shared_ptr<RecvConn>>& recv) const {
  PathStats all;  // what this peer's traffic used, either direction
  auto add = [&](const PathStats& s) {
    all.device_direct |= s.device_direct;
    all.cpu_mediated |= s.cpu_mediated;
  };
  // A peer's incoming connection may be of another transport (its own choice): those add nothing.
  if (auto* s = dynamic_cast<const VerbsSendConn*>(send)) add(s->path());
  for (const auto& c : recv)
    if (auto* r = dynamic_cast<const VerbsRecvConn*>(c.get())) add(r->path());
  return all.describe();
}

void VerbsTransport::add_stats(std::map<std::string, int64_t>& out, const std::vector<std::string>& paths) const {
  const auto& cache = nic_->cache();  // touched under the engine lock, as stats() is
  out["verbs_reg_cache_hits"] = static_cast<int64_t>(cache.hits());
  out["verbs_reg_cache_misses"] = static_cast<int64_t>(cache.misses());
  out["verbs_reg_cache_stale"] = static_cast<int64_t>(cache.stale());
  out["verbs_peers"] = out["verbs_device_direct_peers"] = out["verbs_cpu_mediated_peers"] = 0;
  for (const auto& path : paths) {
    ++out["verbs_peers"];
    if (path.find("device-direct") != std::string::npos) ++out["verbs_device_direct_peers"];
    if (path.find("cpu-mediated") != std::string::npos) ++out["verbs_cpu_mediated_peers"];
  }
}

namespace {
// Optional: a host without rdma-core or an active RDMA port has no verbs transport (`why` says so).
const TransportRegistrar registrar({"verbs", "RDMA verbs", true,
                                    [](const Context& ctx, std::string* why) -> std::unique_ptr<Transport> {
                                      auto t = VerbsTransport::create(ctx, why);
                                      if (!t) *why = "no usable RDMA device: " + *why;
                                      return t;
                                    }});
}  // namespace

}  // namespace dicomm::transport::verbs
