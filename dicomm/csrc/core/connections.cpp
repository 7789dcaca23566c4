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

transport::SendConn* Engine::connection_to(int peer, transport::Clock::time_point deadline, ConnectFor why) {
  std::unique_lock<std::mutex> connecting(*peers_[peer].connecting, std::defer_lock);
  if (why != ConnectFor::kNotice) connecting.lock();
  else if (!connecting.try_lock()) return nullptr;
  Card card;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[peer];
    if (p.send) return p.send.get();
    if (p.dead || p.send_closed || (closed_ && !(why == ConnectFor::kConnector && told_))) return nullptr;
    if (p.card_known) card = p.card;
  }
  // Store and connect calls block: they run without the engine lock, under the peer's own.
  if (card.boot_id.empty()) card = bootstrap_.fetch(peer, &stopping_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!peers_[peer].card_known) learn_card_locked(peer, card);
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
    if (!p.dead) tell_late_connection_locked(*conn);
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
      connection_to(q, transport::Clock::now() + limit, ConnectFor::kConnector);
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

void Engine::learn_card_locked(int peer, const Card& card) {
  Peer& p = peers_[peer];
  p.card = card;
  p.card_known = true;
  if (card.same_kernel(card_)) note_local_locked(p);
  settle_held_locked(p);
  watch_process_locked(peer, p);  // from now on its exit is noticed, connected or not
}

// The card is known: each held connection is the rank's process or an impostor. The first genuine
// one is admitted; a later one claiming the same rank is refused as any second connection is.
void Engine::settle_held_locked(Peer& p) {
  std::vector<std::shared_ptr<transport::RecvConn>> held;
  held.swap(p.held);
  held_ -= static_cast<int>(held.size());
  for (auto& conn : held) {
    std::string why = impostor_locked(p, *conn);
    if (why.empty() && !p.recv.empty())
      why = "a second connection claiming rank " + std::to_string(conn->peer()) + ", which already has a live one";
    if (!why.empty()) {
      graveyard_.push_back(std::move(conn));
      on_rejected(why);
      continue;
    }
    admit_locked(p, std::move(conn));
  }
  poller_->wake();  // a sleeping poller now has these connections to watch, or none to skip
}

// The card reader: while some peer has held connections and no card, read its card (blocking,
// without the engine lock, under the peer's connecting lock as connection_to does).
void Engine::read_held_cards() {
  for (;;) {
    int peer = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int q = 0; q < size_ && peer < 0; ++q)
        if (!peers_[q].held.empty() && !peers_[q].card_known) peer = q;
      if (peer < 0 || stopping_ || closed_) {
        card_reader_running_ = false;
        return;
      }
    }
    std::lock_guard<std::mutex> connecting(*peers_[peer].connecting);
    bool known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = peers_[peer].card_known;
    }
    Card card;
    std::string failure;
    if (!known) {
      try {
        card = bootstrap_.fetch(peer, &stopping_);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[peer];
    if (p.card_known) continue;  // connection_to read it meanwhile (and settled the held ones)
    if (failure.empty()) {
      learn_card_locked(peer, card);
      continue;
    }
    // No card to check them against: they never deliver.
    held_ -= static_cast<int>(p.held.size());
    for (auto& conn : p.held) {
      graveyard_.push_back(std::move(conn));
      on_rejected("a connection claiming rank " + std::to_string(peer) +
                  " from this host, whose process could not be checked against the rank's card: " + failure);
    }
    p.held.clear();
    if (stopping_) {
      card_reader_running_ = false;
      return;
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
  // From a process on this host, before the rank's card was read: whether it is the rank's
  // process is not known yet, so nothing it sends is delivered until the card says so.
  if (conn->peer_pid() && !p.card_known && !closed_) {
    p.held.push_back(std::move(conn));
    ++held_;
    if (!card_reader_running_) {
      if (card_reader_.joinable()) card_reader_.join();  // the last run has returned (or is returning)
      card_reader_running_ = true;
      card_reader_ = std::thread([this] { read_held_cards(); });
    }
    return;
  }
  if (std::string why = impostor_locked(p, *conn); !why.empty()) {
    graveyard_.push_back(std::move(conn));
    on_rejected(why);
    return;
  }
  admit_locked(p, std::move(conn));
}

void Engine::admit_locked(Peer& p, std::shared_ptr<transport::RecvConn> conn) {
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

int64_t Engine::cma_pid(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  const Peer& p = peers_[peer];
  if (p.dead) return 0;
  if (p.recv.empty()) return -1;  // not connected yet
  const int64_t pid = p.recv.front()->cma_pid();
  for (const auto& conn : p.recv)
    if (conn->cma_pid() != pid) return 0;  // every connection from one process, each with the right
  return pid;
}

}  // namespace dicomm
