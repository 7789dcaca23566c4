// Failures: a peer that is gone, a closed send side, abort and close.
#include "core/engine.h"
#include "core/log.h"

namespace dicomm {

// ---------------------------------------------------------------- failures

void Engine::peer_lost(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  if (p.dead) return;
  // A peer that told us it aborted, then closed: its reason is the news, not its EOF (which would
  // blame it, a live rank, for what it only passed on). Likewise a peer that applied another
  // rank's notice and closed without passing it on: that notice may wait unread on our connection
  // from its sender, read after this one only because peers are read in rank order.
  if (!closed_ && notice_waiting_locked(peer)) {
    apply_abort_notice_locked();
    return;
  }
  p.dead = true;
  p.dead_reason = why;
  ++counters_.peers_lost;
  unwatch_process_locked(p);
  size_t pending = 0;
  for (auto& [op, r] : in_flight_) pending += r->op == P2PRequest::Op::kSend ? r->peer == peer : r->matched_from == peer;
  // A peer that closes after its last message is routine; one that leaves work behind is not.
  log(pending ? LogLevel::kWarn : LogLevel::kInfo,
      "rank " + std::to_string(rank_) + " lost rank " + std::to_string(peer) + ": " + why);
  if (p.send) graveyard_.push_back(std::move(p.send));
  for (auto& c : p.recv) graveyard_.push_back(std::move(c));
  p.recv.clear();
  held_ -= static_cast<int>(p.held.size());
  for (auto& c : p.held) graveyard_.push_back(std::move(c));
  p.held.clear();
  queues_.drop_rendezvous_from(peer);  // buffered eager messages stay receivable
  std::string text = "rank " + std::to_string(peer) + " is gone: " + why;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    P2PRequest& r = *it->second;
    bool involved = r.op == P2PRequest::Op::kSend ? r.peer == peer : r.matched_from == peer;
    if (involved) {
      fail(r, ErrorKind::kPeer, r.describe() + " failed: " + text);
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
  // Receives waiting on this peer fail. Any-source receives fail only once no peer is left:
  // another rank may still answer them (a rank that finished and closed is routine).
  bool anyone_left = false;
  for (int q = 0; q < size_; ++q) anyone_left |= q != rank_ && !peers_[q].dead;
  for (auto& r : queues_.take_posted_waiting_on(peer, !anyone_left))
    fail(*r, ErrorKind::kPeer, r->describe() + " failed: " + text);
}

void Engine::peer_failed(int peer, const PeerError& e) {
  if (dynamic_cast<const ProtocolError*>(&e)) {
    ++counters_.protocol_violations;
    log(LogLevel::kWarn, "rank " + std::to_string(rank_) + " closed its connections with rank " + std::to_string(peer) +
                             ", which broke the wire protocol: " + e.what());
  }
  peer_lost(peer, e.what());
}

void Engine::send_side_closed(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  // A rank that aborts tells us why on its connection to us, then closes: read that first, so
  // its reason fails our requests, not the close (which would blame a live rank).
  try {
    for (auto& c : p.recv)
      while (c->progress(true)) {
      }
  } catch (const PeerError& e) {
    peer_failed(peer, e);  // applies a notice it read meanwhile
    return;
  }
  if (!closed_ && notice_waiting_locked(peer)) {
    apply_abort_notice_locked();
    return;
  }
  p.send_closed = true;
  p.dead_reason = why;
  if (p.send) graveyard_.push_back(std::move(p.send));
  std::string text = "rank " + std::to_string(peer) + " is gone: " + why;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    P2PRequest& r = *it->second;
    if (r.op == P2PRequest::Op::kSend && r.peer == peer) {
      fail(r, ErrorKind::kPeer, r.describe() + " failed: " + text);
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Engine::notice_waiting_locked(int closing) {
  for (int q = 0; q < size_ && !notice_pending_; ++q) {
    if (q == closing || q == rank_ || peers_[q].dead) continue;
    for (size_t i = 0; i < peers_[q].recv.size() && !notice_pending_; ++i) {
      try {
        peers_[q].recv[i]->progress(false);
      } catch (const std::exception&) {
        // That peer's own failure is for the next progress pass to judge.
      }
    }
  }
  return notice_pending_;
}

ErrorKind Engine::kind_for_locked(const P2PRequest& r) const {
  if (!(r.tag & kCollectiveTagBit) || r.tag == ~Tag{0}) return ErrorKind::kPeer;
  uint64_t seq = (r.tag >> 20) & ((uint64_t{1} << 43) - 1);  // collective_tag()'s layout
  return seq == (abort_seq_ & ((uint64_t{1} << 43) - 1)) ? abort_kind_ : ErrorKind::kPeer;
}

void Engine::fail_everything(const std::string& why, bool free_now) {
  for (auto& p : peers_) {
    if (p.send) graveyard_.push_back(std::move(p.send));
    for (auto& c : p.recv) graveyard_.push_back(std::move(c));
    p.recv.clear();
  }
  // No transport may touch a failed request's buffer any more; inside a progress pass the
  // connections go at its end (one of them may be on the stack).
  if (free_now) graveyard_.clear();
  for (auto& [op, r] : in_flight_) fail(*r, kind_for_locked(*r), r->describe() + " failed: " + why);
  in_flight_.clear();
  for (auto& r : queues_.take_all_posted()) fail(*r, kind_for_locked(*r), r->describe() + " failed: " + why);
  for (auto& r : queues_.take_self_sends()) fail(*r, kind_for_locked(*r), r->describe() + " failed: " + why);
}

void Engine::abort(const std::string& reason, ErrorKind kind, bool tell_peers, uint64_t collective_seq) {
  if (tell_peers) connect_for_notice();
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  if (tell_peers) send_abort_notices_locked(reason, kind, collective_seq);
  closed_ = true;
  abort_reason_ = reason;
  abort_kind_ = kind;
  abort_seq_ = collective_seq;
  fail_everything(abort_reason_);
  done_cv_.notify_all();
}

// The notice travels on our connection to each peer. On a fresh communicator (a mismatch in its
// first collective) some are not open yet, and a peer we never connected to would only see our
// close, as if we had died: open them first, briefly (a peer not reachable by then learns it so).
// One that another thread is connecting to is left to that attempt (its connection carries the notice
// when it opens after the abort): waiting for it would hold every other peer's notice up to its timeout.
void Engine::connect_for_notice() {
  std::vector<int> unconnected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    for (int q = 0; q < size_; ++q)
      // Its card known, or it connected to us (it published the card first): no wait on the store.
      if (q != rank_ && !peers_[q].send && !peers_[q].dead && !peers_[q].send_closed &&
          (peers_[q].card_known || !peers_[q].recv.empty()))
        unconnected.push_back(q);
  }
  const auto until = transport::Clock::now() + std::chrono::seconds(1);
  for (int q : unconnected) {
    try {
      connection_to(q, until, ConnectFor::kNotice);
    } catch (const std::exception&) {
      // Unreachable now: it hears of the abort as our connection's close.
    }
  }
}

void Engine::close() {
  stopping_ = true;
  if (connector_thread_.joinable()) {
    if (connector_thread_.get_id() == std::this_thread::get_id()) connector_thread_.detach();
    else connector_thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      closed_ = true;
      abort_reason_ = "communicator closed";
      fail_everything(abort_reason_);
    }
    stop_ = true;
    done_cv_.notify_all();
    idle_cv_.notify_all();
  }
  poller_->wake();
  {
    // The card reader stops within a store slice once stopping_ is set; it takes mu_, so not held here.
    std::unique_lock<std::mutex> lock(mu_);
    std::thread reader = std::move(card_reader_);
    lock.unlock();
    if (reader.joinable()) {
      if (reader.get_id() == std::this_thread::get_id()) reader.detach();
      else reader.join();
    }
  }
  if (progress_thread_.joinable()) {
    if (progress_thread_.get_id() == std::this_thread::get_id()) progress_thread_.detach();
    else progress_thread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : peers_) unwatch_process_locked(p);
  transports_.clear();  // listening sockets
  bootstrap_.release_store();
}

}  // namespace dicomm
