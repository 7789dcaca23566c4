#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "core/types.h"

namespace dicomm::transport::tcp {
namespace {

constexpr int kSocketBuffer = 4 * 1024 * 1024;

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x < lo || x > hi)
    throw ValueError(std::string(name) + "='" + v + "' is invalid; expected an integer in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}

// DICOMM_SOCKET_IFNAME's IPv4 address, else the first non-loopback interface that is up, else
// loopback (a single-host job still works).
std::string pick_address() {
  const char* want = std::getenv("DICOMM_SOCKET_IFNAME");
  ifaddrs* list = nullptr;
  std::string found, names;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      names += (names.empty() ? "" : ", ") + std::string(i->ifa_name);
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
      bool match = want && *want ? std::strcmp(i->ifa_name, want) == 0 : !(i->ifa_flags & IFF_LOOPBACK);
      if (match && found.empty()) found = text;
    }
    freeifaddrs(list);
  }
  if (want && *want && found.empty())
    throw ValueError(std::string("DICOMM_SOCKET_IFNAME=") + want + " names no IPv4 interface that is up; available: " + names);
  return found.empty() ? "127.0.0.1" : found;
}

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

int connect_one(const sockaddr_in& sa, Clock::time_point deadline, const std::string& what) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw PeerError(what + ": socket(): " + errno_text(errno));
  tune(fd);  // before connect, so the window scale reflects the buffer size
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    int err = errno;
    close(fd);
    throw PeerError(what + ": connect: " + errno_text(err) + " (is the peer still running?)");
  }
  pollfd pfd{fd, POLLOUT, 0};
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&pfd, 1, static_cast<int>(std::max<long>(left, 0))) != 1) err = ETIMEDOUT;
  else getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    close(fd);
    throw PeerError(what + ": connect: " + errno_text(err) + " (is the peer still running?)");
  }
  return fd;
}

}  // namespace

TcpTransport::TcpTransport(const Context& ctx)
    : ctx_(ctx),
      nstreams_(env_int("DICOMM_TCP_STREAMS", 4, 1, 64)),
      chunk_bytes_(static_cast<size_t>(env_int("DICOMM_TCP_CHUNK_KB", 1024, 64, 1 << 20)) * 1024) {
  std::string ip = pick_address();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  sa.sin_port = 0;
  tune(fd);  // accepted sockets inherit the buffer sizes
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 1024) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    throw Error("tcp transport cannot listen on " + ip + ": " + errno_text(err));
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  address_ = ip + ":" + std::to_string(ntohs(sa.sin_port));
  acceptor_ = std::make_unique<Acceptor>(fd, ctx_, TransportId::kTcp);
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
    int fd = connect_one(sa, deadline, what);
    Hello h;
    h.transport = static_cast<uint16_t>(TransportId::kTcp);
    h.token = ctx_.token;
    h.src = ctx_.rank;
    h.dst = peer;
    h.stream = static_cast<uint16_t>(s);
    h.nstreams = static_cast<uint16_t>(nstreams_);
    try {
      write_all(fd, &h, sizeof(h), deadline, what);
    } catch (...) {
      close(fd);
      throw;
    }
    streams.push_back(std::make_unique<TcpStream>(fd, ctx_.poller, what + " (stream " + std::to_string(s) + ")"));
  }
  return std::make_unique<TcpSendConn>(peer, std::move(streams), ctx_.sink, chunk_bytes_);
}

bool TcpTransport::progress() {
  std::vector<Acceptor::Accepted> accepted;
  bool did = acceptor_->progress(&accepted);
  for (auto& a : accepted) {
    int src = a.hello.src;
    if (a.passed_fd >= 0) close(a.passed_fd);
    std::string what = "tcp connection from rank " + std::to_string(src);
    auto stream = std::make_unique<TcpStream>(a.fd, ctx_.poller, what);
    auto conn = recv_conns_[src].lock();
    bool fresh = !conn || conn->nstreams() != a.hello.nstreams;
    if (fresh) conn = std::make_shared<TcpRecvConn>(src, a.hello.nstreams, ctx_.sink);
    if (!conn->attach(a.hello.stream, std::move(stream))) {
      ctx_.sink->on_rejected("duplicate tcp stream " + std::to_string(a.hello.stream) + " from rank " + std::to_string(src));
      continue;
    }
    if (fresh) {
      recv_conns_[src] = conn;
      ctx_.sink->on_accept(conn);
    }
  }
  return did;
}

}  // namespace dicomm::transport::tcp
