#include "transport/socket.h"

#include "core/config.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/types.h"

namespace dicomm::transport {

std::string errno_text(int err) { return std::string(strerror(err)) + " (errno " + std::to_string(err) + ")"; }

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

size_t read_some(int fd, void* buf, size_t n, const std::string& what) {
  for (;;) {
    ssize_t r = recv(fd, buf, n, 0);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) throw ConnectionClosed(what + ": connection closed by the peer (it exited or closed its communicator)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw PeerError(what + ": " + errno_text(errno));
  }
}

size_t writev_some(int fd, const iovec* iov, int iovcnt, const std::string& what) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  for (;;) {
    ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw PeerError(what + ": " + errno_text(errno));
  }
}

void write_all(int fd, const void* buf, size_t n, Clock::time_point deadline, const std::string& what) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    iovec iov{const_cast<char*>(p), n};
    size_t w = writev_some(fd, &iov, 1, what);
    p += w;
    n -= w;
    if (n == 0) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw SetupTimedOut(what + ": timed out writing");
    pollfd pfd{fd, POLLOUT, 0};
    poll(&pfd, 1, static_cast<int>(left));
  }
}

HelloReader::State HelloReader::step() {
  while (got_ < sizeof(Hello)) {
    iovec iov{reinterpret_cast<char*>(&hello_) + got_, sizeof(Hello) - got_};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC);
    if (r > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int passed;
          std::memcpy(&passed, CMSG_DATA(c), sizeof(int));
          passed_fd_ = UniqueFd(passed);
        }
      }
      got_ += static_cast<size_t>(r);
      // Reject garbage as soon as the magic is visible, without waiting for the rest.
      if (got_ >= sizeof(uint32_t) && hello_.magic != kHelloMagic) {
        error_ = "not a dicomm hello (bad magic: garbage bytes or a foreign client)";
        return State::kFailed;
      }
      continue;
    }
    if (r == 0) {
      error_ = "client closed the connection after " + std::to_string(got_) + " of " +
               std::to_string(sizeof(Hello)) + " hello bytes";
      return State::kFailed;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      error_ = "reading hello: " + errno_text(errno);
      return State::kFailed;
    }
    if (Clock::now() >= deadline_) {
      error_ = "no complete hello before the handshake deadline (" + std::to_string(got_) +
               " bytes received: a silent client)";
      return State::kFailed;
    }
    return State::kPending;
  }
  return State::kDone;
}

}  // namespace dicomm::transport

namespace dicomm::transport {

void read_exact(int fd, void* buf, size_t n, Clock::time_point deadline, const std::string& what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, static_cast<char*>(buf) + got, n - got, MSG_DONTWAIT);
    if (r > 0) { got += static_cast<size_t>(r); continue; }
    if (r == 0) throw ConnectionClosed(what + ": the peer closed the connection during connection setup");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) throw PeerError(what + ": " + errno_text(errno));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw SetupTimedOut(what + ": no connection data from the peer in time");
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, static_cast<int>(left));
  }
}

void connector_handshake(int fd, Hello h, const std::string& key, Clock::time_point deadline,
                         const std::string& what, int pass_fd) {
  Challenge c;
  read_exact(fd, &c, sizeof(c), deadline, what + " (waiting for the handshake challenge)");
  if (c.magic != kHelloMagic || c.version != kHelloVersion)
    throw PeerError(what + ": the listener is not a dicomm rank of this version (bad challenge)");
  h.nonce = random_nonce();
  sign_hello(h, key, c.nonce);
  iovec iov{&h, sizeof(h)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
  }
  // The first sendmsg carries the descriptor; a short write is finished by write_all.
  ssize_t w;
  do {
    w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
      if (Clock::now() >= deadline) throw SetupTimedOut(what + ": timed out sending the hello");
    }
  } while (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK));
  if (w < 0) throw PeerError(what + ": sending hello: " + errno_text(errno));
  if (static_cast<size_t>(w) < sizeof(h))
    write_all(fd, reinterpret_cast<char*>(&h) + w, sizeof(h) - static_cast<size_t>(w), deadline, what);
  Digest proof;
  try {
    read_exact(fd, proof.data(), proof.size(), deadline, what);
  } catch (const ConnectionClosed&) {
    throw ConnectionClosed(what + ": the peer refused the handshake (a different or missing DICOMM_JOB_SECRET, a "
                           "connection of this rank it already has, or another job at that address)");
  }
  Digest want = accept_proof(h, key);
  if (!digests_equal(proof.data(), want.data(), want.size()))
    throw PeerError(what + ": the listener could not prove it belongs to this job (wrong handshake proof)");
}

}  // namespace dicomm::transport

namespace dicomm::transport {

// torchrun says so: every rank of the job runs on this host (a subgroup of a larger job does not
// know, and keeps listening on the interface).
bool single_host_job() {
  const char* world = std::getenv("WORLD_SIZE");
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  return world && local && *world && std::atoi(world) > 0 && std::atoi(world) == std::atoi(local);
}

std::string listen_ip(const std::string& ifname) {
  const char* want = ifname.empty() ? nullptr : ifname.c_str();
  if (!want && single_host_job()) return "127.0.0.1";
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

}  // namespace dicomm::transport
