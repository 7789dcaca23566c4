#include "transport/poller.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/types.h"

namespace dicomm::transport {

Poller::Poller() : epfd_(epoll_create1(EPOLL_CLOEXEC)), eventfd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (epfd_.get() < 0 || eventfd_.get() < 0) throw Error(std::string("cannot create epoll/eventfd: ") + strerror(errno));
  add(eventfd_.get());
}

Poller::~Poller() = default;

void Poller::add(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void Poller::remove(int fd) { epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr); }

void Poller::want_write(int fd, bool on) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (on ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.fd = fd;
  epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, fd, &ev);
}

int Poller::wait(int timeout_ms) {
  epoll_event events[32];
  int n = epoll_wait(epfd_.get(), events, 32, timeout_ms);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == eventfd_.get()) {
      uint64_t v;
      while (read(eventfd_.get(), &v, sizeof(v)) > 0) {}
    }
  }
  return n < 0 ? 0 : n;
}

void Poller::wake() {
  uint64_t one = 1;
  ssize_t r = write(eventfd_.get(), &one, sizeof(one));
  (void)r;
}

}  // namespace dicomm::transport
