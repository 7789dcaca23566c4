#include "transport/shm/shm_transport.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"
#include "core/types.h"
#include "transport/registry.h"
#include "transport/shm/ptracer.h"

namespace dicomm::transport::shm {
namespace {

// A receiver reads this word from the sender with process_vm_readv to learn whether
// cross-memory attach works between the two (seccomp, Yama or namespaces may forbid it).
constexpr uint64_t kProbeMagic = 0x6469636f6d6d2121ull;
volatile uint64_t probe_word = kProbeMagic;

sockaddr_un abstract_address(const std::string& name, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(sa.sun_path) - 2);
  std::memcpy(sa.sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sa;
}

std::string probe_cma(int pid, uint64_t addr) {
  uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(value)};
  ssize_t r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (r != static_cast<ssize_t>(sizeof(value))) return "process_vm_readv: " + errno_text(errno);
  if (value != kProbeMagic) return "probe word mismatch (different pid namespace?)";
  return "";
}

}  // namespace

ShmTransport::ShmTransport(const Context& ctx) : ctx_(ctx) {
  caps_.reach = Capabilities::Reach::kSameKernel;
  caps_.preference = 30;  // one copy (or none) through memory beats any network path
  caps_.spin = ctx.config->spin;
  cma_allowed_ = ctx.config->shm_cma;
  static std::atomic<int> counter{0};
  address_ = "dicomm-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
             token_hex(random_token()).substr(0, 8);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  socklen_t len;
  sockaddr_un sa = abstract_address(address_, &len);
  if (fd.get() < 0 || bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 || listen(fd.get(), 1024) != 0) {
    const int err = errno;
    throw Error("shm transport cannot listen on its Unix socket: " + errno_text(err));
  }
  acceptor_ = std::make_unique<Acceptor>(std::move(fd), ctx_, TransportId::kShm);
}

bool ShmTransport::can_reach(const Card& self, const Card& peer, std::string* why) const {
  std::string reason;
  if (!peer.addresses.count("shm")) reason = "the peer publishes no shm address";
  else if (!self.same_kernel(peer)) reason = "it runs on another host (" + peer.hostname + ")";
  else if (self.net_ns != peer.net_ns) reason = "it runs in another network namespace (no shared Unix sockets)";
  if (why) *why = reason;
  return reason.empty();
}

std::unique_ptr<SendConn> ShmTransport::connect(int peer, const Card& card, Clock::time_point deadline) {
  std::string what = "shm connection to rank " + std::to_string(peer);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  socklen_t len;
  sockaddr_un sa = abstract_address(card.addresses.at("shm"), &len);
  if (fd.get() < 0 || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    const int err = errno;
    throw PeerError(what + ": connect: " + errno_text(err) + " (is the peer still running?)");
  }
  {
    // As the listener checks us: abstract sockets have no permissions, and the token in the
    // store proves nothing to us (whoever rewrote the card read it too).
    ucred listener{};
    socklen_t ll = sizeof(listener);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &listener, &ll) != 0)
      throw PeerError(what + ": the listener's credentials are unavailable: " + errno_text(errno));
    if (listener.uid != geteuid())
      throw PeerError(what + ": the listener at its address is pid " + std::to_string(listener.pid) + " of uid " +
                      std::to_string(listener.uid) + ", but this job runs as uid " + std::to_string(geteuid()) +
                      " (was rank " + std::to_string(peer) + "'s address card in the store replaced?)");
  }
  std::unique_ptr<Mapping> map;
  {
    const UniqueFd memfd(memfd_create("dicomm-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));  // the mapping keeps the memory alive
    // Sealed at its size: the receiver maps it only so (a segment shrunk under it would SIGBUS it).
    if (memfd.get() < 0 || ftruncate(memfd.get(), sizeof(Segment)) != 0 ||
        fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      const int err = errno;
      throw Error(what + ": cannot create the shared segment: " + errno_text(err));
    }
    map = std::make_unique<Mapping>(memfd.get());
    Hello h;
    h.transport = static_cast<uint16_t>(TransportId::kShm);
    h.src = ctx_.rank;
    h.dst = peer;
    h.extra[0] = reinterpret_cast<uint64_t>(&probe_word);
    if (cma_allowed_) allow_cross_memory_attach_from(static_cast<pid_t>(card.pid));  // it probes us on accept
    connector_handshake(fd.get(), h, ctx_.key, deadline, what, memfd.get());
  }
  set_nonblocking(fd.get());
  ucred cred{};
  socklen_t cl = sizeof(cred);
  int receiver_pid = cma_allowed_ && getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 ? cred.pid : 0;
  auto control = std::make_unique<ControlSocket>(std::move(fd), ctx_.poller, what);
  return std::make_unique<ShmSendConn>(peer, std::move(control), std::move(map), ctx_.sink, receiver_pid, counters_);
}

bool ShmTransport::progress() {
  std::vector<Acceptor::Accepted> accepted;
  bool did = acceptor_->progress(&accepted);
  for (auto& a : accepted) {
    int src = a.hello.src;
    std::string what = "shm connection from rank " + std::to_string(src);
    struct stat st{};
    ucred cred{};
    socklen_t cl = sizeof(cred);
    std::string why;
    // a.fd and a.passed_fd close when `a` goes, unless taken below.
    if (a.passed_fd.get() < 0) why = "shm hello without a segment descriptor";
    else if (fstat(a.passed_fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(Segment))
      why = "shm segment of the wrong size (another dicomm version?)";
    else if ((fcntl(a.passed_fd.get(), F_GET_SEALS) & F_SEAL_SHRINK) == 0)
      why = "shm segment not sealed against shrinking (its sender could make our reads fault)";
    else if (getsockopt(a.fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid <= 0)
      why = "shm peer credentials unavailable";
    else if (cred.uid != geteuid())  // abstract Unix sockets have no permissions: any local user can connect
      why = "shm connection from uid " + std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) +
            "), but this job runs as uid " + std::to_string(geteuid());
    if (!why.empty()) {
      ctx_.sink->on_rejected(why + " (from rank " + std::to_string(src) + ")");
      continue;
    }
    std::unique_ptr<Mapping> map;
    try {
      map = std::make_unique<Mapping>(a.passed_fd.get());
    } catch (const std::exception& e) {
      ctx_.sink->on_rejected(e.what());
      continue;
    }
    a.passed_fd.reset();  // the mapping keeps the memory alive
    if (cma_allowed_) allow_cross_memory_attach_from(cred.pid);  // its sender writes into us
    std::string cma_problem = cma_allowed_ ? probe_cma(cred.pid, a.hello.extra[0]) : "disabled by DICOMM_SHM_CMA=0";
    if (!cma_problem.empty()) {
      ++counters_->cma_unavailable;
      log(cma_allowed_ ? LogLevel::kWarn : LogLevel::kInfo,
          "rank " + std::to_string(ctx_.rank) + ": cross-memory attach from rank " + std::to_string(src) +
              " unavailable (" + cma_problem + "); large messages from it take the two-copy shared-memory pipeline");
    }
    auto control = std::make_unique<ControlSocket>(std::move(a.fd), ctx_.poller, what);
    ctx_.sink->on_accept(std::make_shared<ShmRecvConn>(src, std::move(control), std::move(map), ctx_.sink,
                                                      cred.pid, cma_problem.empty(), ctx_.config->shm_split));
  }
  return did;
}

void ShmTransport::add_stats(std::map<std::string, int64_t>& out, const std::vector<std::string>&) const {
  out["shm_bytes_written_by_sender"] = counters_->bytes_written_by_sender;
  out["shm_cma_unavailable"] = counters_->cma_unavailable;
}

namespace {
const TransportRegistrar registrar({"shm", "shared-memory", false, [](const Context& ctx, std::string*) -> std::unique_ptr<Transport> {
                                      return std::make_unique<ShmTransport>(ctx);
                                    }});
}  // namespace

}  // namespace dicomm::transport::shm
