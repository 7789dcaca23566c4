// Small helpers over non-blocking sockets shared by the transports.
#pragma once

#include <cstddef>
#include <string>
#include <sys/types.h>
#include <sys/uio.h>
#include <utility>

#include "core/handshake.h"
#include "core/types.h"
#include "transport/transport.h"
#include "transport/unique_fd.h"

namespace dicomm::transport {

std::string errno_text(int err);

// Where listeners bind: the IPv4 address of `ifname` (DICOMM_SOCKET_IFNAME); loopback for a job known
// to run on one host (torchrun's WORLD_SIZE == LOCAL_WORLD_SIZE); else the first non-loopback
// interface that is up, else loopback. Never the wildcard address: nothing listens where the job
// does not talk.
std::string listen_ip(const std::string& ifname);
bool single_host_job();

// The peer closed the connection in order (EOF), as opposed to an error such as a reset.
struct ConnectionClosed : PeerError { using PeerError::PeerError; };
// A connection's setup ran out of time: the peer may be slow rather than gone.
struct SetupTimedOut : PeerError { using PeerError::PeerError; };
void set_nonblocking(int fd);
// > 0 bytes moved; 0 would block; throws PeerError(`what` + reason) on EOF or error.
size_t read_some(int fd, void* buf, size_t n, const std::string& what);
size_t writev_some(int fd, const iovec* iov, int iovcnt, const std::string& what);
// Writes all of buf on a blocking (or nearly idle) socket before the deadline; throws PeerError.
void write_all(int fd, const void* buf, size_t n, Clock::time_point deadline, const std::string& what);
// Reads exactly n bytes before the deadline (blocking or not, the socket is polled); throws PeerError.
void read_exact(int fd, void* buf, size_t n, Clock::time_point deadline, const std::string& what);

// The connector's half of the handshake (core/handshake.h): reads the listener's challenge, sends
// `h` signed with `key` (with `pass_fd` attached on Unix sockets when >= 0), and checks the
// listener's proof. Throws PeerError naming `what` when the listener refuses or cannot prove itself.
void connector_handshake(int fd, Hello h, const std::string& key, Clock::time_point deadline,
                         const std::string& what, int pass_fd = -1);

// Reads a Hello arriving in pieces on a freshly accepted non-blocking socket (and, on Unix
// sockets, a file descriptor passed with it), honouring a deadline.
class HelloReader {
 public:
  HelloReader(UniqueFd fd, Clock::time_point deadline, const Nonce& challenge)
      : fd_(std::move(fd)), deadline_(deadline), challenge_(challenge) {}
  enum class State { kPending, kDone, kFailed };
  State step();  // reads what is available
  const Hello& hello() const { return hello_; }
  const std::string& error() const { return error_; }
  int fd() const { return fd_.get(); }
  const Nonce& challenge() const { return challenge_; }
  UniqueFd release_fd() { return std::move(fd_); }
  UniqueFd release_passed_fd() { return std::move(passed_fd_); }

 private:
  UniqueFd fd_;
  Clock::time_point deadline_;
  Nonce challenge_;
  Hello hello_;
  size_t got_ = 0;
  UniqueFd passed_fd_;  // a descriptor sent with the hello (Unix sockets)
  std::string error_;
};

}  // namespace dicomm::transport
