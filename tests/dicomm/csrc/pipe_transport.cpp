// `dicomm._C_toy_transport`: "pipe", a toy transport written outside the engine against nothing but
// transport/transport.h, and registered into `dicomm._C` at run time (`_C._register_transport`).
// It proves that a transport plugs in without core/ naming it. Unix stream sockets on this host,
// every message eager (copied into the connection's queue, so a send completes in post()), no
// handshake key, no rendezvous: a test fixture, never a transport for real jobs.
#include <pybind11/pybind11.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/types.h"
#include "transport/poller.h"
#include "transport/registry.h"
#include "transport/socket.h"
#include "transport/transport.h"

namespace dicomm::toy {
namespace {

using transport::Capabilities;
using transport::Clock;

constexpr uint32_t kHelloMagic = 0x70697065;  // "pipe"

struct Frame {  // before each message's payload
  uint64_t tag, meta, bytes;
  uint32_t tag_seq, reserved;
};

sockaddr_un address_of(const std::string& name, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(sa.sun_path) - 2);
  std::memcpy(sa.sun_path + 1, name.data(), n);  // the abstract namespace: nothing on disk
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sa;
}

// Owns one socket.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }

 private:
  int fd_;
};

[[noreturn]] void fail(const std::string& what) { throw PeerError(what + ": " + std::strerror(errno)); }

class PipeSendConn : public transport::SendConn {
 public:
  PipeSendConn(int peer, int fd, transport::Sink* sink) : peer_(peer), fd_(fd), sink_(sink) {}
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "pipe"; }
  void post(transport::SendOp* op) override {
    Frame f{op->hdr.tag, op->hdr.meta, op->hdr.bytes, op->hdr.tag_seq, 0};
    out_.append(reinterpret_cast<const char*>(&f), sizeof(f));
    out_.append(static_cast<const char*>(op->buf), op->hdr.bytes);
    sink_->on_send_done(op);  // copied: the sender's buffer is free again
    flush();
  }
  bool progress(bool) override { return flush(); }
  bool busy() const override { return !out_.empty(); }  // no fd says when the socket drains

 private:
  bool flush() {
    size_t before = out_.size();
    while (!out_.empty()) {
      ssize_t n = ::send(fd_.get(), out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) fail("pipe send to rank " + std::to_string(peer_));
      out_.erase(0, static_cast<size_t>(n));
    }
    return out_.size() != before;
  }
  int peer_;
  Fd fd_;
  transport::Sink* sink_;  // not owned: the engine, which outlives its connections
  std::string out_;        // frames not yet written
};

class PipeRecvConn : public transport::RecvConn {
 public:
  PipeRecvConn(int peer, int fd, transport::Sink* sink) : peer_(peer), fd_(fd), sink_(sink) {}
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "pipe"; }
  bool progress(bool) override {
    bool did = false;
    char chunk[1 << 16];
    for (;;) {
      ssize_t n = ::recv(fd_.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n == 0) throw transport::ConnectionClosed("rank " + std::to_string(peer_) + " closed its pipe");
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) fail("pipe receive from rank " + std::to_string(peer_));
      in_.append(chunk, static_cast<size_t>(n));
      did = true;
    }
    size_t off = 0;
    while (in_.size() - off >= sizeof(Frame)) {
      Frame f;
      std::memcpy(&f, in_.data() + off, sizeof(f));
      if (in_.size() - off - sizeof(f) < f.bytes) break;
      transport::Header h{f.tag, f.meta, f.bytes, 0, f.tag_seq};
      sink_->on_message(*this, h, in_.data() + off + sizeof(f));  // eager: valid during the call
      off += sizeof(f) + f.bytes;
    }
    in_.erase(0, off);
    return did;
  }
  bool busy() const override { return false; }
  void pull(uint64_t, transport::RecvOp*) override { throw Error("the pipe transport has no rendezvous"); }
  void refuse(uint64_t, const transport::Refusal&) override { throw Error("the pipe transport has no rendezvous"); }

 private:
  int peer_;
  Fd fd_;
  transport::Sink* sink_;  // not owned: the engine, which outlives its connections
  std::string in_;         // bytes received, not yet a whole message
};

class PipeTransport : public transport::Transport {
 public:
  explicit PipeTransport(const transport::Context& ctx) : ctx_(ctx), listener_(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) {
    caps_.reach = Capabilities::Reach::kSameKernel;
    caps_.preference = -1;  // below every built-in transport: auto never picks it, only transport="pipe"
    static std::atomic<int> counter{0};
    address_ = "dicomm-toy-pipe-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    socklen_t len;
    sockaddr_un sa = address_of(address_, &len);
    if (listener_.get() < 0 || ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
        ::listen(listener_.get(), 64) != 0)
      fail("pipe transport cannot listen");
    ctx_.poller->add(listener_.get());
  }
  const char* name() const override { return "pipe"; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string address() const override { return address_; }
  bool can_reach(const Card&, const Card& peer, std::string* why) const override {
    if (peer.addresses.count("pipe")) return true;
    if (why) *why = "the peer has no pipe transport";
    return false;
  }
  std::unique_ptr<transport::SendConn> connect(int peer, const Card& card, Clock::time_point) override {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    Fd owned(fd);
    socklen_t len;
    sockaddr_un sa = address_of(card.addresses.at("pipe"), &len);
    uint32_t hello[2] = {kHelloMagic, static_cast<uint32_t>(ctx_.rank)};
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
        ::send(fd, hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello)))
      fail("pipe connection to rank " + std::to_string(peer));
    return std::make_unique<PipeSendConn>(peer, owned.release(), ctx_.sink);
  }
  bool progress() override {
    bool did = false;
    for (;;) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) break;
      Fd owned(fd);
      uint32_t hello[2] = {0, 0};
      pollfd p{fd, POLLIN, 0};  // the connector writes its hello right after connecting
      if (::poll(&p, 1, 1000) != 1 || ::recv(fd, hello, sizeof(hello), MSG_WAITALL) != sizeof(hello) ||
          hello[0] != kHelloMagic || hello[1] >= static_cast<uint32_t>(ctx_.size)) {
        ctx_.sink->on_rejected("a pipe connection without a valid hello");
        continue;
      }
      ctx_.poller->add(fd);  // new messages wake the engine's sleeper
      ctx_.sink->on_accept(std::make_shared<PipeRecvConn>(static_cast<int>(hello[1]), owned.release(), ctx_.sink));
      did = true;
    }
    return did;
  }

 private:
  transport::Context ctx_;
  Capabilities caps_;
  Fd listener_;
  std::string address_;
};

const transport::TransportFactory kFactory{
    "pipe", "toy pipe", true,
    [](const transport::Context& ctx, std::string*) -> std::unique_ptr<transport::Transport> {
      return std::make_unique<PipeTransport>(ctx);
    }};

}  // namespace
}  // namespace dicomm::toy

PYBIND11_MODULE(_C_toy_transport, m) {
  m.doc() = "Test fixture: the toy 'pipe' transport, for dicomm._C._register_transport";
  m.def("factory", [] {
    return pybind11::capsule(&dicomm::toy::kFactory, dicomm::transport::kTransportFactoryCapsule);
  }, "A capsule holding the pipe transport's factory.");
}
