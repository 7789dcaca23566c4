// Connections: the transport chosen per peer, lazy connects, and incoming connections.
#include <string_view>

#include "core/engine.h"
#include "core/log.h"
#include "transport/socket.h"
#include "transport/verbs/verbs_conn.h"

namespace dicomm {

// ---------------------------------------------------------------- connections

// auto: same host -> shm; another host -> verbs when both ranks publish it, else tcp. The choice
// is made once per peer (on first contact) and logged with its reason.
transport::Transport& Engine::choose_transport(int peer, const Card& card) {
  const std::string who = "rank " + std::to_string(peer);
  std::string why_shm, why_verbs;
  bool shm_ok = transports_.at("shm")->can_reach(card_, card, &why_shm);
  auto verbs = transports_.find("verbs");
  bool verbs_ok = verbs != transports_.end() && verbs->second->can_reach(card_, card, &why_verbs);
  if (verbs == transports_.end()) why_verbs = "this rank has no RDMA device: " + verbs_why_;
  if (forced_ == "shm" && !shm_ok)
    throw ValueError("DICOMM_TRANSPORT=shm, but " + who + " cannot be reached through shared memory: " + why_shm +
                     "; use auto or tcp");
  if (forced_ == "verbs" && !verbs_ok)
    throw ValueError("DICOMM_TRANSPORT=verbs, but " + who + " cannot be reached through RDMA verbs: " + why_verbs +
                     "; use auto or tcp");
  std::string name = forced_ != "auto" ? forced_ : shm_ok ? "shm" : verbs_ok ? "verbs" : "tcp";
  std::string reason = forced_ != "auto" ? "forced by DICOMM_TRANSPORT/transport=" + forced_
                       : shm_ok          ? "same host"
                       : verbs_ok        ? "another host, both ranks have RDMA"
                                         : "another host (" + why_shm + "), no verbs: " + why_verbs;
  // Cross-host choices are what an operator needs to see; same-host shm is the quiet default.
  log(name == "shm" ? LogLevel::kDebug : LogLevel::kInfo,
      "rank " + std::to_string(rank_) + " -> " + who + ": " + name + " (" + reason + ")");
  return *transports_.at(name);
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
  set_transport_locked(p, t.name());
  ++counters_["connections_opened"];
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
      if (!closed_) peer_lost(q, e.what());
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
  ++counters_["connections_accepted"];
  if (p.transport.empty()) set_transport_locked(p, conn->transport_name());
  // By value: two equal literals need not share an address.
  if (std::string_view(conn->transport_name()) == "shm") note_local_locked(p);  // shared memory: the same host
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
  const int64_t n = ++counters_["rejected_connections"];
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
  if (p.transport != "verbs") return p.transport;
  transport::verbs::PathStats all;  // what this peer's traffic used, either direction
  auto add = [&](const transport::verbs::PathStats& s) {
    all.device_direct |= s.device_direct;
    all.cpu_mediated |= s.cpu_mediated;
  };
  if (auto* s = dynamic_cast<const transport::verbs::VerbsSendConn*>(p.send.get())) add(s->path());
  for (const auto& c : p.recv)
    if (auto* r = dynamic_cast<const transport::verbs::VerbsRecvConn*>(c.get())) add(r->path());
  return all.describe();
}

}  // namespace dicomm
