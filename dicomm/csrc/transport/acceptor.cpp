#include "transport/acceptor.h"

#include "core/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/poller.h"

namespace dicomm::transport {

namespace {

// At most this many handshakes wait at once: each holds a descriptor, and a flood of silent
// connections must not use up the process's open-file limit (new communicators need descriptors
// too). A quarter of the soft limit, within [16, 1024]; DICOMM_MAX_PENDING_HANDSHAKES overrides.
size_t pending_limit(const EngineConfig& config) {
  if (config.max_pending_handshakes) return *config.max_pending_handshakes;
  rlimit rl{};
  size_t soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 4096;
  return std::clamp<size_t>(soft / 4, 16, 1024);
}

}  // namespace

Acceptor::Acceptor(UniqueFd listen_fd, const Context& ctx, TransportId id)
    : listen_fd_(std::move(listen_fd)), ctx_(ctx), id_(id), max_pending_(pending_limit(*ctx.config)) {
  ctx_.poller->add(listen_fd_.get());
}

Acceptor::~Acceptor() {
  for (auto& r : pending_) ctx_.poller->remove(r->fd());
  ctx_.poller->remove(listen_fd_.get());
}


bool Acceptor::progress(std::vector<Accepted>* out) {
  bool did = false;
  // Ask before accepting: Linux's accept4 allocates a socket, its inode and a file before it looks at
  // the backlog, and on EAGAIN frees them again through RCU. Spinning callers come here every few dozen
  // polls; under Soft-RoCE in QEMU that churn made the verbs transport's 8 B half round trip 17-23 us
  // instead of 15-18 (docs/rdma.md, fix 5).
  pollfd ready{listen_fd_.get(), POLLIN, 0};
  while (poll(&ready, 1, 0) > 0 && (ready.revents & POLLIN)) {
    if (pending_.size() >= max_pending_) {
      did |= step_pending(out);  // those whose hello is in leave first
      if (pending_.size() >= max_pending_) {  // then the one that waited longest makes room
        ctx_.poller->remove(pending_.front()->fd());
        pending_.pop_front();
        ctx_.sink->on_rejected("too many handshakes pending at once (" + std::to_string(max_pending_) +
                               "): the oldest, still silent, was closed");
      }
    }
    UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) break;  // taken meanwhile, or a transient error (EMFILE...): try again on the next event
    did = true;
    Challenge c;
    c.nonce = random_nonce();
    // A fresh socket's buffer takes 24 bytes at once; one that does not is not worth waiting for.
    if (send(fd.get(), &c, sizeof(c), MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(c))) {
      ctx_.sink->on_rejected("could not send the handshake challenge: " + errno_text(errno));
      continue;
    }
    auto reader = std::make_unique<HelloReader>(std::move(fd), Clock::now() + ctx_.handshake_timeout, c.nonce);
    ctx_.poller->add(reader->fd());
    pending_.push_back(std::move(reader));
  }
  return step_pending(out) || did;
}

bool Acceptor::step_pending(std::vector<Accepted>* out) {
  bool did = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    HelloReader& r = **it;
    auto state = r.step();
    if (state == HelloReader::State::kPending) { ++it; continue; }
    did = true;
    ctx_.poller->remove(r.fd());
    std::string why = state == HelloReader::State::kFailed
                          ? r.error()
                          : check_hello(r.hello(), ctx_.key, r.challenge(), ctx_.rank, ctx_.size, id_);
    if (why.empty()) {
      Digest proof = accept_proof(r.hello(), ctx_.key);
      if (send(r.fd(), proof.data(), proof.size(), MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(proof.size()))
        why = "could not send the handshake proof: " + errno_text(errno);
    }
    if (why.empty()) {
      Accepted a;
      a.hello = r.hello();
      a.fd = r.release_fd();
      a.passed_fd = r.release_passed_fd();
      out->push_back(std::move(a));
    } else {
      ctx_.sink->on_rejected(why);  // the reader's destructor closes the socket
    }
    it = pending_.erase(it);
  }
  return did;
}

}  // namespace dicomm::transport
