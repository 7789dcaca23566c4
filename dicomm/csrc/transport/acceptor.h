// The listening side shared by the transports: accepts connections without blocking and runs each
// one's handshake against a deadline. Connections that fail it are closed and reported to the sink.
#pragma once

#include <list>
#include <memory>
#include <vector>

#include "transport/socket.h"
#include "transport/transport.h"

namespace dicomm::transport {

class Acceptor {
 public:
  Acceptor(UniqueFd listen_fd, const Context& ctx, TransportId id);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  struct Accepted {
    UniqueFd fd;         // non-blocking
    UniqueFd passed_fd;  // a descriptor sent with the hello (Unix sockets), or none
    Hello hello;
  };
  // Accepts and advances handshakes; appends those that passed check_hello to `out`.
  bool progress(std::vector<Accepted>* out);

 private:
  bool step_pending(std::vector<Accepted>* out);  // advances every pending handshake once
  UniqueFd listen_fd_;
  Context ctx_;
  TransportId id_;
  size_t max_pending_;  // handshakes waiting at once
  std::list<std::unique_ptr<HelloReader>> pending_;
};

}  // namespace dicomm::transport
