// Connections: the transport chosen per peer, lazy connects, and incoming connections.
#include "core/engine.h"
#include "core/log.h"
#include "transport/socket.h"

namespace dicomm {

// ---------------------------------------------------------------- connections

// auto: the reachable transport of highest preference (same host -> shm; another host -> verbs
// when both ranks have RDMA, else tcp). The choice is made once per peer (on first contact) and
// logged with its reason.
transport::Transport& Engine::choose_transport(int peer, const Card& card) {
  const std::string who = "rank " + std::to_string(peer);
  std::string skipped;  // why the preferred ones cannot serve this peer
  for (const auto& [name, why] : unavailable_) skipped += "; no " + name + ": " + why;
  for (const auto& t : transports_) {
    if (forced_ != "auto" && forced_ != t->name()) continue;
    std::string why;
    if (!t->can_reach(card_, card, &why)) {
      if (forced_ != "auto")
        throw ValueError("DICOMM_TRANSPORT=" + forced_ + ", but " + who + " cannot be reached through " + forced_ +
                         ": " + why + "; use auto");
      skipped += "; no " + std::string(t->name()) + ": " + why;
      continue;
    }
    const bool same_kernel = t->capabilities().reach == transport::Capabilities::Reach::kSameKernel;
    std::string reason = forced_ != "auto" ? "forced by DICOMM_TRANSPORT/transport=" + forced_
                         : same_kernel     ? "same host"
                                           : "another host" + (skipped.empty() ? "" : " (" + skipped.substr(2) + ")");
    // Cross-host choices are what an operator needs to see; same-host choices are the quiet default.
    log(same_kernel ? LogLevel::kDebug : LogLevel::kInfo,
        "rank " + std::to_string(rank_) + " -> " + who + ": " + t->name() + " (" + reason + ")");
    return *t;
  }
  throw ValueError("no transport can reach " + who + (skipped.empty() ? "" : ": " + skipped.substr(2)));
}

transport::SendConn* Engine::connection_to(int peer) { return connection_to(peer, transport::Clock::now() + timeout_); }

transport::SendConn* Engine::connection_to(int peer, transport::Clock::time_point deadline) {
  std::unique_lock<std::mutex> connecting(*peers_[peer].connecting);
  Card card;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[peer];
    if (p.send) return p.send.get();
    if (p.dead || p.send_closed || closed_) return nullptr;
    if (p.card_known) card = p.card;
  }
  // Store and connect calls block: they run without the engine lock, under the peer's own.
  if (card.boot_id.empty()) card = bootstrap_.fetch(peer, &stopping_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[peer];
    p.card = card;
    p.card_known = true;
    if (card.same_kernel(card_)) note_local_locked(p);
    // Connections accepted before the card was known are checked now.
    for (auto it = p.recv.begin(); it != p.recv.end();) {
      std::string why = impostor_locked(p, **it);
      if (why.empty()) { ++it; continue; }
      graveyard_.push_back(std::move(*it));
      it = p.recv.erase(it);
      on_rejected(why);
    }
    watch_process_locked(peer, p);  // from now on its exit is noticed, connected or not
  }
  transport::Transport& t = choose_transport(peer, card);
  std::unique_ptr<transport::SendConn> conn;
  // A listener flooded with silent connections closes the oldest pending handshakes to make room
  // (transport/acceptor.cpp); ours may be among them: try again a few times before giving up.
  for (int attempt = 1;; ++attempt) {
    try {
      conn = t.connect(peer, card, deadline);
      break;
    } catch (const transport::ConnectionClosed&) {
      if (attempt == 3 || transport::Clock::now() >= deadline || stopping_) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * attempt));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  if (p.dead || closed_) {
    graveyard_.push_back(std::move(conn));
    graveyard_.clear();
    return nullptr;
  }
  p.send = std::move(conn);
  set_transport_locked(p, t);
  ++counters_.connections_opened;
  poller_->wake();  // the progress thread now has one more connection to watch
  return p.send.get();
}

// Connecting to every peer at once (not on first use) is what lets a rank notice a peer that dies
// before it ever talked to it: the connection's EOF, or the refused connect, says so in well under
// a second instead of at the timeout. DICOMM_CONNECT=lazy keeps connections on first use.
void Engine::connect_all() {
  const auto limit = std::chrono::seconds(10);  // slow is not dead: a setup timeout only defers to first use
  for (int k = 1; k < size_ && !stopping_; ++k) {
    int q = (rank_ + k) % size_;  // each rank starts with a different peer
    try {
      connection_to(q, transport::Clock::now() + limit);
    } catch (const transport::SetupTimedOut&) {
      // Slow, not necessarily gone: the first isend to that peer tries again.
    } catch (const PeerError& e) {
      std::lock_guard<std::mutex> lock(mu_);
      // A peer that already connected to us and then refuses or resets ours may have finished and
      // closed in order, its last messages still draining on our receive side: as for a send side that
      // closes later, that side decides whether it is gone.
      if (!closed_ && peers_[q].recv.empty()) peer_lost(q, e.what());
      else if (!closed_) send_side_closed(q, e.what());
      graveyard_.clear();
    } catch (const std::exception&) {
      // A store timeout or a configuration error: the first isend to that peer reports it.
    }
  }
}

void Engine::on_accept(std::shared_ptr<transport::RecvConn> conn) {
  Peer& p = peers_[conn->peer()];
  // One live connection per rank: a second one claiming the same rank is an impostor (or a bug)
  // and must not reach the real one's messages; the first connection stays untouched.
  if (!p.recv.empty()) {
    graveyard_.push_back(std::move(conn));
    on_rejected("a second connection claiming rank " + std::to_string(graveyard_.back()->peer()) +
                ", which already has a live one");
    return;
  }
  if (std::string why = impostor_locked(p, *conn); !why.empty()) {
    graveyard_.push_back(std::move(conn));
    on_rejected(why);
    return;
  }
  ++counters_.connections_accepted;
  transport::Transport* t = transport_named(conn->transport_name());
  if (!p.transport && t) set_transport_locked(p, *t);
  // A same-kernel transport (shared memory...): the peer runs on this host.
  if (t && t->capabilities().reach == transport::Capabilities::Reach::kSameKernel) note_local_locked(p);
  if (p.dead) {  // a late connection from a peer we gave up on: do not resurrect it
    graveyard_.push_back(std::move(conn));
    return;
  }
  p.recv.push_back(std::move(conn));
}

// The connecting process of a same-host connection must be the one the rank's card names.
std::string Engine::impostor_locked(const Peer& p, const transport::RecvConn& conn) const {
  int64_t pid = conn.peer_pid();
  if (!pid || !p.card_known || !p.card.same_kernel(card_) || p.card.pid_ns != card_.pid_ns || pid == p.card.pid) return "";
  return "a connection claiming rank " + std::to_string(conn.peer()) + " from pid " + std::to_string(pid) +
         ", but rank " + std::to_string(conn.peer()) + " is pid " + std::to_string(p.card.pid);
}

// A flood of bad connections must not flood the log: the first few are logged in full, then one
// line per interval says how many more there were (the counter has them all).
void Engine::on_rejected(const std::string& why) {
  constexpr int kLoggedInFull = 5;
  constexpr auto kInterval = std::chrono::seconds(10);
  const int64_t n = ++counters_.rejected_connections;
  const std::string who = "rank " + std::to_string(rank_);
  if (n <= kLoggedInFull) {
    log(LogLevel::kWarn, who + " rejected an incoming connection: " + why +
                             (n == kLoggedInFull ? " (further rejections are summarised every 10 s)" : ""));
    rejections_logged_at_ = std::chrono::steady_clock::now();
    return;
  }
  ++rejections_unlogged_;
  auto now = std::chrono::steady_clock::now();
  if (now - rejections_logged_at_ < kInterval) return;
  log(LogLevel::kWarn, who + " rejected " + std::to_string(rejections_unlogged_) + " more incoming connections (" +
                           std::to_string(n) + " in all); the latest: " + why);
  rejections_unlogged_ = 0;
  rejections_logged_at_ = now;
}

std::string Engine::path_of_locked(const Peer& p) const {
  if (!p.transport) return "";
  return p.transport->describe_path(p.send.get(), p.recv);
}

}  // namespace dicomm
