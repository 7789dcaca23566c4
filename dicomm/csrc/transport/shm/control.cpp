#include "transport/shm/control.h"

#include <cerrno>
#include <sys/socket.h>
#include <unistd.h>

namespace dicomm::transport::shm {

ControlSocket::ControlSocket(UniqueFd fd, Poller* poller, std::string what)
    : fd_(std::move(fd)), poller_(poller), what_(std::move(what)) {
  poller_->add(fd_.get());
}

ControlSocket::~ControlSocket() { poller_->remove(fd_.get()); }

void ControlSocket::ring_if_sleeping(const std::atomic<uint32_t>& sleeping) {
  // Pairs with the fence in the sleeper's arm(): either it sees our publication or we see its flag.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_relaxed)) {
    char b = 1;
    ssize_t r = send(fd_.get(), &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)r;  // a full socket already holds doorbells; a dead peer is seen by drain()
  }
}

bool ControlSocket::drain() {
  char buf[256];
  for (;;) {
    ssize_t r = recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (r > 0) continue;
    if (r == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

}  // namespace dicomm::transport::shm
