// Connections: the transport chosen per peer, lazy connects, and incoming connections.
#include "core/engine.h"
#include "core/log.h"

namespace dicomm {

// ---------------------------------------------------------------- connections

transport::Transport& Engine::choose_transport(int peer, const Card& card) {
  std::string why;
  bool shm_ok = transports_["shm"]->can_reach(card_, card, &why);
  if (forced_ == "shm" && !shm_ok)
    throw ValueError("DICOMM_TRANSPORT=shm, but rank " + std::to_string(peer) +
                     " cannot be reached through shared memory: " + why + "; use auto or tcp");
  bool use_shm = forced_ == "shm" || (forced_ == "auto" && shm_ok);
  std::string reason = forced_ != "auto" ? "forced by DICOMM_TRANSPORT/transport=" + forced_
                       : use_shm          ? "same host"
                                          : "no shared memory: " + why;
  log(LogLevel::kDebug, "rank " + std::to_string(rank_) + " -> rank " + std::to_string(peer) + ": " +
                            (use_shm ? "shm" : "tcp") + " (" + reason + ")");
  return *transports_[use_shm ? "shm" : "tcp"];
}

transport::SendConn* Engine::connection_to(int peer) {
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
  if (card.boot_id.empty()) card = bootstrap_.fetch(peer);
  transport::Transport& t = choose_transport(peer, card);
  auto conn = t.connect(peer, card, transport::Clock::now() + timeout_);
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  p.card = card;
  p.card_known = true;
  if (p.dead || closed_) {
    graveyard_.push_back(std::move(conn));
    graveyard_.clear();
    return nullptr;
  }
  p.send = std::move(conn);
  p.transport = t.name();
  ++counters_["connections_opened"];
  poller_->wake();  // the progress thread now has one more connection to watch
  return p.send.get();
}

void Engine::on_accept(std::shared_ptr<transport::RecvConn> conn) {
  Peer& p = peers_[conn->peer()];
  ++counters_["connections_accepted"];
  if (p.transport.empty()) p.transport = conn->transport_name();
  if (p.dead) {  // a late connection from a peer we gave up on: do not resurrect it
    graveyard_.push_back(std::move(conn));
    return;
  }
  p.recv.push_back(std::move(conn));
}

void Engine::on_rejected(const std::string& why) {
  ++counters_["rejected_connections"];
  log(LogLevel::kWarn, "rank " + std::to_string(rank_) + " rejected an incoming connection: " + why);
}

}  // namespace dicomm
