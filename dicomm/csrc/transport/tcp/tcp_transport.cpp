#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <ifaddrs.h>
#include <iterator>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "core/types.h"
#include "transport/registry.h"

namespace dicomm::transport::tcp {
namespace {

constexpr int kSocketBuffer = 4 * 1024 * 1024;


void tune(int fd) {
  int one = 1, buf = kSocketBuffer;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

sockaddr_in parse_address(const std::string& addr, int peer) {
  auto colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (colon == std::string::npos || inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1)
    throw PeerError("rank " + std::to_string(peer) + " published a malformed tcp address '" + addr + "'");
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(addr.c_str() + colon + 1)));
  return sa;
}

UniqueFd connect_one(const sockaddr_in& sa, Clock::time_point deadline, const std::string& what) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw PeerError(what + ": socket(): " + errno_text(errno));
  tune(fd.get());  // before connect, so the window scale reflects the buffer size
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    throw PeerError(what + ": connect: " + errno_text(err) + " (is the peer still running?)");
  }
  pollfd pfd{fd.get(), POLLOUT, 0};
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&pfd, 1, static_cast<int>(std::max<long>(left, 0))) != 1)
    throw SetupTimedOut(what + ": connect: no answer in time");
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) throw PeerError(what + ": connect: " + errno_text(err) + " (is the peer still running?)");
  return fd;
}

// The uid owning the other end of a TCP connection made from this host (and network namespace),
// as /proc/net/tcp lists it, and that end's socket inode; -1 when that end is not on this host.
// TCP has no SO_PEERCRED.
long local_peer_uid(int fd, unsigned long* inode = nullptr) {
  sockaddr_in mine{}, theirs{};
  socklen_t a = sizeof(mine), b = sizeof(theirs);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) != 0)
    return -1;
  char want_local[32], want_remote[32];  // the connector's socket: its local end is our remote one
  std::snprintf(want_local, sizeof(want_local), "%08X:%04X", theirs.sin_addr.s_addr, ntohs(theirs.sin_port));
  std::snprintf(want_remote, sizeof(want_remote), "%08X:%04X", mine.sin_addr.s_addr, ntohs(mine.sin_port));
  FILE* f = std::fopen("/proc/net/tcp", "r");
  if (!f) return -1;
  char line[512];
  long uid = -1;
  while (uid < 0 && std::fgets(line, sizeof(line), f)) {
    char local[64], remote[64];
    long owner;
    unsigned long ino = 0;
    if (std::sscanf(line, " %*d: %63s %63s %*x %*s %*s %*s %ld %*d %lu", local, remote, &owner, &ino) == 4 &&
        std::strcmp(local, want_local) == 0 && std::strcmp(remote, want_remote) == 0) {
      uid = owner;
      if (inode) *inode = ino;
    }
  }
  std::fclose(f);
  return uid;
}

// The process holding socket `inode` open (the first found: a forked child may share it), 0 if
// none is visible. A scan of /proc, done once per accepted connection from this host.
int64_t pid_holding_socket(unsigned long inode) {
  if (inode == 0) return 0;
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  DIR* proc = opendir("/proc");
  if (!proc) return 0;
  int64_t found = 0;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    const std::string fds = std::string("/proc/") + e->d_name + "/fd";
    DIR* d = opendir(fds.c_str());
    if (!d) continue;
    while (dirent* fe = readdir(d)) {
      if (fe->d_name[0] == '.') continue;
      char target[64];
      ssize_t n = readlink((fds + "/" + fe->d_name).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (want == target) {
        found = std::atoll(e->d_name);
        break;
      }
    }
    closedir(d);
    if (found) break;
  }
  closedir(proc);
  return found;
}

}  // namespace

TcpTransport::TcpTransport(const Context& ctx)
    : ctx_(ctx),
      nstreams_(ctx.config->tcp_streams), chunk_bytes_(ctx.config->tcp_chunk_bytes) {
  caps_.reach = Capabilities::Reach::kAnyHost;
  caps_.preference = 10;  // the fallback: any host, no device needed
  // Over TCP only a short spin pays: an 8 B half round trip measured 25-26 us with 30-80 us of
  // spin, 32-59 us without; a reply usually lands within one loopback round trip.
  caps_.spin = ctx.config->tcp_spin;
  std::string ip = listen_ip(ctx.config->socket_ifname);
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  sa.sin_port = 0;
  if (fd.get() >= 0) tune(fd.get());  // accepted sockets inherit the buffer sizes
  if (fd.get() < 0 || bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd.get(), 1024) != 0) {
    const int err = errno;
    throw Error("tcp transport cannot listen on " + ip + ": " + errno_text(err));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  address_ = ip + ":" + std::to_string(ntohs(sa.sin_port));
  acceptor_ = std::make_unique<Acceptor>(std::move(fd), ctx_, TransportId::kTcp);
}

bool TcpTransport::can_reach(const Card&, const Card& peer, std::string* why) const {
  if (peer.addresses.count("tcp")) return true;
  if (why) *why = "the peer publishes no tcp address";
  return false;
}

std::unique_ptr<SendConn> TcpTransport::connect(int peer, const Card& card, Clock::time_point deadline) {
  std::string what = "tcp connection to rank " + std::to_string(peer);
  sockaddr_in sa = parse_address(card.addresses.at("tcp"), peer);
  std::vector<std::unique_ptr<TcpStream>> streams;
  for (int s = 0; s < nstreams_; ++s) {
    UniqueFd fd = connect_one(sa, deadline, what);
    // As the listener checks us: a listener on this host must be the job's user. The token in
    // the store proves nothing to us (whoever rewrote the card read it too); without a secret
    // this is what keeps another local user from receiving a rank's messages.
    long uid = local_peer_uid(fd.get());
    if (uid >= 0 && uid != static_cast<long>(geteuid()))
      throw PeerError(what + ": the listener at " + card.addresses.at("tcp") + " is a process of uid " +
                      std::to_string(uid) + " on this host, but this job runs as uid " + std::to_string(geteuid()) +
                      " (was rank " + std::to_string(peer) + "'s address card in the store replaced?)");
    Hello h;
    h.transport = static_cast<uint16_t>(TransportId::kTcp);
    h.src = ctx_.rank;
    h.dst = peer;
    h.stream = static_cast<uint16_t>(s);
    h.nstreams = static_cast<uint16_t>(nstreams_);
    connector_handshake(fd.get(), h, ctx_.key, deadline, what);
    streams.push_back(std::make_unique<TcpStream>(std::move(fd), ctx_.poller, what + " (stream " + std::to_string(s) + ")"));
  }
  return std::make_unique<TcpSendConn>(peer, std::move(streams), ctx_.sink, chunk_bytes_);
}

bool TcpTransport::progress() {
  std::vector<Acceptor::Accepted> accepted;
  bool did = acceptor_->progress(&accepted);
  for (auto& a : accepted) {
    int src = a.hello.src;  // a.fd and a.passed_fd close when `a` goes, unless taken below
    // From this host, only the job's own user may connect (another user may have read the store).
    unsigned long inode = 0;
    long uid = local_peer_uid(a.fd.get(), &inode);
    if (uid >= 0 && uid != static_cast<long>(geteuid())) {
      ctx_.sink->on_rejected("tcp connection claiming rank " + std::to_string(src) + " from a process of uid " +
                             std::to_string(uid) + " on this host, but this job runs as uid " + std::to_string(geteuid()));
      continue;
    }
    std::string what = "tcp connection from rank " + std::to_string(src);
    auto stream = std::make_unique<TcpStream>(std::move(a.fd), ctx_.poller, what);
    // The connecting process, so that the engine can hold it to the pid of the rank's card, as it
    // does over shared memory (a process of the job's user that read the store is no rank).
    const int64_t pid = uid >= 0 ? pid_holding_socket(inode) : 0;
    // A process's first connection claiming a rank is the only one: a second that claims the same
    // rank (another stream count, a stream index already taken) is refused and never touches the first.
    for (auto it = recv_conns_.begin(); it != recv_conns_.end();) it = it->second.expired() ? recv_conns_.erase(it) : std::next(it);
    auto& slot = recv_conns_[{src, pid}];
    auto conn = slot.lock();
    bool fresh = !conn;
    if (fresh) conn = std::make_shared<TcpRecvConn>(src, a.hello.nstreams, ctx_.sink, pid);
    if (conn->nstreams() != a.hello.nstreams || !conn->attach(a.hello.stream, std::move(stream))) {
      ctx_.sink->on_rejected("a second tcp connection claiming rank " + std::to_string(src) + " (stream " +
                             std::to_string(a.hello.stream) + " of " + std::to_string(a.hello.nstreams) +
                             "), which already has a live one");
      continue;
    }
    if (fresh) {
      slot = conn;
      ctx_.sink->on_accept(conn);
    }
  }
  return did;
}

namespace {
const TransportRegistrar registrar({"tcp", "TCP", false, [](const Context& ctx, std::string*) -> std::unique_ptr<Transport> {
                                      return std::make_unique<TcpTransport>(ctx);
                                    }});
}  // namespace

}  // namespace dicomm::transport::tcp
