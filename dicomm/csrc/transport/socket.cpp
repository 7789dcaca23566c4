#include "transport/socket.h"

#include <cerrno>
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
    if (left <= 0) throw PeerError(what + ": timed out writing");
    pollfd pfd{fd, POLLOUT, 0};
    poll(&pfd, 1, static_cast<int>(left));
  }
}

HelloReader::~HelloReader() {
  if (fd_ >= 0) close(fd_);
  if (passed_fd_ >= 0) close(passed_fd_);
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
    ssize_t r = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (r > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int passed;
          std::memcpy(&passed, CMSG_DATA(c), sizeof(int));
          if (passed_fd_ >= 0) close(passed_fd_);
          passed_fd_ = passed;
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
