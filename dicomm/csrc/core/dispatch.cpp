// Messages in, completions out: matching arrivals against receives and finishing requests.
#include <cstring>

#include "core/engine.h"
#include "core/log.h"

namespace dicomm {

// ---------------------------------------------------------------- matching

void Engine::on_message(transport::RecvConn& conn, const transport::Header& hdr, const void* payload) {
  ++counters_.messages_received;
  if (is_abort_notice(hdr) && on_abort_notice(conn.peer(), payload, hdr.bytes)) return;
  if (is_credit_note(hdr)) {
    on_credit_note(conn.peer(), payload, hdr.bytes);
    return;
  }
  if (payload) received_eager_locked(conn.peer(), hdr.bytes);  // taken unless queued below
  if (numbered(hdr.tag)) received_seq_[{conn.peer(), hdr.tag}] = hdr.tag_seq + 1;
  if (!late_.empty() && discard_if_late(conn, hdr, payload)) return;
  Unexpected msg;
  msg.src = conn.peer();
  msg.hdr = hdr;
  if (!payload) msg.conn = &conn;
  if (auto r = queues_.take_posted(msg.src, hdr.tag)) {
    if (r->withdrawn) {  // it reached the place of a receive that timed out
      drop_late_locked(conn, hdr, payload);
      return;
    }
    match(r, std::move(msg), payload);  // an eager payload goes straight into the receive buffer
    return;
  }
  ++counters_.unexpected_messages;
  if (payload) msg.data.assign(static_cast<const char*>(payload), static_cast<const char*>(payload) + hdr.bytes);
  queues_.add_unexpected(std::move(msg));
}

// A receive from a given source that timed out unmatched gave up on one numbered message of its
// (source, tag) stream: that message is discarded when it comes (a rendezvous sender's send fails)
// instead of landing in a later receive; every other message is delivered. Messages of one stream
// never overtake, so numbers below an arriving one will never come and are forgotten.
bool Engine::discard_if_late(transport::RecvConn& conn, const transport::Header& hdr, const void* payload) {
  auto it = late_.find({conn.peer(), hdr.tag});
  if (it == late_.end()) return false;
  std::set<uint32_t>& given_up = it->second;
  bool late = false;
  for (auto s = given_up.begin(); s != given_up.end();) {
    const auto behind = static_cast<int32_t>(*s - hdr.tag_seq);  // serial arithmetic: numbers wrap
    if (behind > 0) { ++s; continue; }
    late |= behind == 0;
    s = given_up.erase(s);
  }
  if (given_up.empty()) late_.erase(it);
  if (!late) return false;
  drop_late_locked(conn, hdr, payload);
  return true;
}

void Engine::drop_late_locked(transport::RecvConn& conn, const transport::Header& hdr, const void* payload) {
  ++counters_.late_messages_discarded;
  log(LogLevel::kWarn, "rank " + std::to_string(rank_) + " discarded a message from rank " + std::to_string(conn.peer()) +
                           " " + describe_tag(hdr.tag) + " (" + std::to_string(hdr.bytes) +
                           " B): it arrived after the receive waiting for it timed out");
  if (!payload) conn.refuse(hdr.msg_id, transport::Refusal{transport::Refusal::kLate, 0, 0});  // rendezvous
}

// The number r would have taken: receives before it take the first numbers of the stream not yet
// arrived and not already given up; r takes the next one.
void Engine::give_up_locked(const P2PRequest& r, size_t ahead) {
  const std::pair<int, Tag> stream{r.peer, r.tag};
  auto next = received_seq_.find(stream);
  uint32_t s = next == received_seq_.end() ? 0 : next->second;
  std::set<uint32_t>& given_up = late_[stream];
  for (;; ++s) {
    if (given_up.count(s)) continue;
    if (ahead == 0) break;
    --ahead;
  }
  given_up.insert(s);
}

bool Engine::fits(P2PRequest& r, int src, const transport::Header& hdr, transport::Refusal* refusal) {
  auto who = [src] { return "rank " + std::to_string(src); };  // only for errors: not on the hot path
  if (hdr.bytes > r.capacity) {
    std::string calls = r.meta != 0 && hdr.meta != 0 && r.meta != hdr.meta
                            ? "; " + who() + " sent " + Communicator::describe_meta(hdr.meta) + " but this receive expects " +
                                  Communicator::describe_meta(r.meta)
                            : "";
    fail(r, ErrorKind::kMismatch,
         r.describe() + ": the message from " + who() + " has " + std::to_string(hdr.bytes) +
             " B but the buffer holds only " + std::to_string(r.capacity) + " B (nothing was truncated)" + calls);
    *refusal = transport::Refusal{transport::Refusal::kTooSmall, r.capacity, r.meta};
    return false;
  }
  if (r.meta != 0 && r.meta != hdr.meta) {
    fail(r, ErrorKind::kMismatch,
         r.describe() + ": " + who() + " sent " + Communicator::describe_meta(hdr.meta) + " but this receive expects " +
             Communicator::describe_meta(r.meta));
    *refusal = transport::Refusal{transport::Refusal::kMetaDiffers, r.capacity, r.meta};
    return false;
  }
  return true;
}

void Engine::match(const RequestSP& r, Unexpected&& msg, const void* payload) {
  r->matched_from = msg.src;
  transport::Refusal refusal;
  if (!fits(*r, msg.src, msg.hdr, &refusal)) {
    if (msg.rendezvous()) msg.conn->refuse(msg.hdr.msg_id, refusal);
    if (msg.self_send) on_send_refused(&msg.self_send->send_op, refusal);
    return;
  }
  const size_t n = msg.hdr.bytes;
  if (msg.self_send) {
    if (n) std::memcpy(r->buf, msg.self_send->send_op.buf, n);
    finish(*msg.self_send, rank_, n);
    finish(*r, msg.src, n);
  } else if (!msg.rendezvous()) {
    if (n) std::memcpy(r->buf, payload ? payload : msg.data.data(), n);
    finish(*r, msg.src, n);
  } else {
    r->recv_op.buf = r->buf;
    r->recv_op.bytes = n;
    Peer& p = peers_[msg.src];
    if (p.transport && n > p.register_above) r->recv_op.mem = p.transport->register_memory(r->buf, n);
    in_flight_[&r->recv_op] = r;
    msg.conn->pull(msg.hdr.msg_id, &r->recv_op);
  }
}

// ---------------------------------------------------------------- completions

void Engine::release_memory(P2PRequest& r) {
  if (!r.send_op.mem.opaque && !r.recv_op.mem.opaque) return;  // small messages register nothing
  for (transport::MemHandle* m : {&r.send_op.mem, &r.recv_op.mem}) {
    if (!m->opaque) continue;
    int peer = r.op == P2PRequest::Op::kSend ? r.peer : r.matched_from;
    if (peer >= 0 && peers_[peer].transport) peers_[peer].transport->deregister_memory(*m);
    m->opaque = nullptr;
  }
}

void Engine::finish(P2PRequest& r, int source, size_t nbytes) {
  release_memory(r);
  r.complete(source, nbytes);
  if (r.op == P2PRequest::Op::kSend) {
    ++counters_.messages_sent;
    counters_.bytes_sent += static_cast<int64_t>(nbytes);
  } else {
    counters_.bytes_received += static_cast<int64_t>(nbytes);
  }
  if (blocked_) done_cv_.notify_all();
  if (caller_polling_) poller_->wake();
}

void Engine::fail(P2PRequest& r, ErrorKind kind, const std::string& text) {
  release_memory(r);
  r.fail(kind, text);
  // A collective whose send failed cannot complete: its receives, which may wait on other ranks
  // that are fine, fail now instead of at the timeout.
  if (r.op == P2PRequest::Op::kSend && (r.tag & kCollectiveTagBit) && r.tag != ~Tag{0}) {
    const Tag same_collective = ~Tag{0xFFFFF};  // collective_tag(): the low 20 bits are the step
    for (auto& other : queues_.take_posted_tagged(r.tag, same_collective))
      if (!other->done()) fail(*other, kind, other->describe() + " failed: a send of the same collective failed (" + text + ")");
  }
  if (blocked_) done_cv_.notify_all();
  if (caller_polling_) poller_->wake();
}

Engine::RequestSP Engine::take_in_flight(const void* op) {
  if (posting_ && op == &(*posting_)->send_op) {
    RequestSP r = *posting_;
    posting_ = nullptr;
    return r;
  }
  auto it = in_flight_.find(op);
  if (it == in_flight_.end()) return nullptr;
  RequestSP r = std::move(it->second);
  in_flight_.erase(it);
  return r;
}

void Engine::on_send_done(transport::SendOp* op) {
  if (RequestSP r = take_in_flight(op)) finish(*r, rank_, op->hdr.bytes);
  else credit_note_sent(op);
}

void Engine::on_send_refused(transport::SendOp* op, const transport::Refusal& why) {
  RequestSP r = take_in_flight(op);
  P2PRequest* req = r.get();
  if (!req) return;
  std::string calls = op->hdr.meta != 0 && why.recv_meta != 0 && op->hdr.meta != why.recv_meta
                          ? "; it sent " + Communicator::describe_meta(op->hdr.meta) + " but the receive expects " +
                                Communicator::describe_meta(why.recv_meta)
                          : "";
  if (why.code == transport::Refusal::kLate) {
    fail(*req, ErrorKind::kTimeout, req->describe() + ": Timed out: the receive waiting for it timed out and was "
                                                      "cancelled before it arrived; the receiver discarded it");
    return;
  }
  std::string text = why.code == transport::Refusal::kTooSmall
                         ? req->describe() + " refused by the receiver: its buffer holds only " +
                               std::to_string(why.recv_bytes) + " B (nothing was truncated)" + calls
                         : req->describe() + " refused by the receiver: it sent " +
                               Communicator::describe_meta(op->hdr.meta) + " but the receive expects " +
                               Communicator::describe_meta(why.recv_meta);
  fail(*req, ErrorKind::kMismatch, text);
}

void Engine::on_recv_done(transport::RecvOp* op) {
  if (RequestSP r = take_in_flight(op)) finish(*r, r->matched_from, op->bytes);
}

}  // namespace dicomm
