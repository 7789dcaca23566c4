// One epoll set per communicator: every socket and doorbell of every transport, plus an eventfd
// to wake the progress thread. Events only wake the thread; it then polls all connections.
#pragma once

#include "transport/unique_fd.h"

namespace dicomm::transport {

class Poller {
 public:
  Poller();
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  void add(int fd);
  void remove(int fd);
  void want_write(int fd, bool on);  // also wake on writability (a socket with queued output)
  // Sleeps up to timeout_ms for any event or wake(); returns the number of events.
  int wait(int timeout_ms);
  void wake();

 private:
  UniqueFd epfd_;
  UniqueFd eventfd_;
};

}  // namespace dicomm::transport
