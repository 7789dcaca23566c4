// Knowing when a peer is gone without waiting out a timeout: the process of a same-host peer is
// watched through a pidfd (its sockets may outlive it in a forked child), and a rank that aborts
// tells every peer why (an abort notice), so their pending requests fail at once and blame the
// rank that failed first, not the neighbour whose connection closed.
#include <cstring>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/log.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace dicomm {
namespace {

// A reserved tag (collective tags never reach the top sequence) and a meta word that says so.
constexpr Tag kAbortNoticeTag = ~Tag{0};
constexpr uint64_t kAbortNoticeMeta = 0x61626f72742121ull;  // "abort!!"
constexpr size_t kNoticeTextMax = 4000;                       // eager on every transport

}  // namespace

void Engine::watch_process_locked(int peer, Peer& p) {
  if (p.pidfd >= 0 || p.dead || !p.card_known || !p.card.same_kernel(card_) || p.card.pid_ns != card_.pid_ns ||
      p.card.pid <= 0 || peer == rank_)
    return;
  int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(p.card.pid), 0));
  if (fd < 0) {
    // A peer that sent its last messages and exited before its card was read: they wait on the
    // connections just admitted, so read them before the peer is lost.
    if (errno == ESRCH) exited_locked(peer, "its process (pid " + std::to_string(p.card.pid) + ") no longer exists");
    return;  // ENOSYS (kernel < 5.3): the sockets' EOF is all there is
  }
  p.pidfd = fd;
  poller_->add(fd);
}

void Engine::unwatch_process_locked(Peer& p) {
  if (p.pidfd < 0) return;
  poller_->remove(p.pidfd);
  ::close(p.pidfd);
  p.pidfd = -1;
}

void Engine::exited_locked(int peer, const std::string& why) {
  // What it sent before it went is still ours: drain its connections first (an EOF there ends it
  // the usual way).
  try {
    for (auto& c : peers_[peer].recv)
      while (c->progress(true)) {
      }
  } catch (const PeerError& e) {
    peer_lost(peer, e.what());
  }
  peer_lost(peer, why);
}

bool Engine::check_processes_locked() {
  pollfd fds[64];
  int peers[64];
  bool did = false;
  for (int base = 0; base < size_; base += 64) {
    int n = 0;
    for (int q = base; q < std::min(size_, base + 64); ++q)
      if (peers_[q].pidfd >= 0 && !peers_[q].dead) {
        fds[n] = {peers_[q].pidfd, POLLIN, 0};
        peers[n++] = q;
      }
    if (n == 0 || poll(fds, static_cast<nfds_t>(n), 0) <= 0) continue;
    for (int i = 0; i < n; ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      exited_locked(peers[i], "its process (pid " + std::to_string(peers_[peers[i]].card.pid) +
                                  ") exited; connections that a forked child inherited stayed open");
      did = true;
    }
  }
  return did;
}

void Engine::send_abort_notices_locked(const std::string& reason, ErrorKind kind, uint64_t collective_seq) {
  told_ = Told{reason, kind, collective_seq};
  std::vector<transport::SendConn*> told;
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[q];
    if (q == rank_ || p.dead || !p.send) continue;
    if (post_abort_notice_locked(*p.send)) told.push_back(p.send.get());
  }
  push_abort_notices(told);
}

// A connection the connector thread opens after we told our peers (it was under way, or that peer's
// card came later) is closed at once: it carries the notice too, or that peer would take the close
// for our death (a live rank blamed, its error not the one every other rank reports).
void Engine::tell_late_connection_locked(transport::SendConn& conn) {
  if (!told_ || !post_abort_notice_locked(conn)) return;
  push_abort_notices({&conn});
}

bool Engine::post_abort_notice_locked(transport::SendConn& conn) {
  auto n = std::make_unique<Notice>();
  uint32_t k = static_cast<uint32_t>(told_->kind);
  n->text.assign(reinterpret_cast<const char*>(&k), sizeof(k));
  n->text.append(reinterpret_cast<const char*>(&told_->collective_seq), sizeof(told_->collective_seq));
  n->text += told_->reason.substr(0, kNoticeTextMax);
  n->op.hdr = transport::Header{kAbortNoticeTag, kAbortNoticeMeta, n->text.size(), 0};
  n->op.buf = n->text.data();
  bool posted = true;
  try {
    conn.post(&n->op);
  } catch (const std::exception&) {
    posted = false;  // That peer is gone too; it needs no notice.
  }
  notices_.push_back(std::move(n));
  return posted;
}

// Push what the sockets did not take at once out before the connections close (briefly: a peer that
// does not read is not worth waiting for).
void Engine::push_abort_notices(const std::vector<transport::SendConn*>& told) {
  auto until = transport::Clock::now() + std::chrono::milliseconds(200);
  for (bool busy = true; busy && transport::Clock::now() < until;) {
    busy = false;
    for (auto* c : told) {
      try {
        c->progress(false);
        busy |= c->busy();
      } catch (const std::exception&) {
      }
    }
  }
}

bool Engine::on_abort_notice(int src, const void* payload, size_t bytes) {
  // kind (4 B), the failed collective's sequence number (8 B), the reason
  constexpr size_t kHead = sizeof(uint32_t) + sizeof(uint64_t);
  if (!payload || bytes < kHead) return false;
  uint32_t k;
  uint64_t seq;
  std::memcpy(&k, payload, sizeof(k));
  std::memcpy(&seq, static_cast<const char*>(payload) + sizeof(k), sizeof(seq));
  if (closed_ || notice_pending_) return true;
  notice_pending_ = true;
  notice_kind_ = k <= static_cast<uint32_t>(ErrorKind::kValue) ? static_cast<ErrorKind>(k) : ErrorKind::kPeer;
  notice_seq_ = seq;
  notice_text_ = "rank " + std::to_string(src) + " aborted the communicator (" +
                 std::string(static_cast<const char*>(payload) + kHead, bytes - kHead) + ")";
  return true;
}

void Engine::apply_abort_notice_locked() {
  if (!notice_pending_ || closed_) return;
  log(LogLevel::kWarn, "rank " + std::to_string(rank_) + ": " + notice_text_);
  closed_ = true;
  abort_reason_ = notice_text_;
  abort_kind_ = notice_kind_;
  abort_seq_ = notice_seq_;
  fail_everything(abort_reason_, /*free_now=*/false);  // the pass frees them
  done_cv_.notify_all();
}

bool Engine::is_abort_notice(const transport::Header& hdr) {
  return hdr.tag == kAbortNoticeTag && hdr.meta == kAbortNoticeMeta;
}

}  // namespace dicomm
