// Flow control for eager messages by credits, as NCCL, UCX and MPI libraries do it: a sender may
// have at most DICOMM_UNEXPECTED_MB of eager bytes to one peer that the peer has not taken yet
// (matched, or discarded as late). Past that a send is announced only (rendezvous): its data
// moves when a receive matches it. So a flood nobody asks for costs the receiver headers, not
// payloads, and a later message on another tag is reached without reading the earlier payloads.
// The receiver tells the sender how many eager bytes it has taken (a credit note: a reserved tag
// on its own connection to the sender) once a quarter of the limit is untold. Transports with
// flow control of their own (verbs: receive credits) keep none of this.
#include <algorithm>
#include <cstring>

#include "core/engine.h"

namespace dicomm {
namespace {

// The abort notices' reserved tag, with a meta word of its own.
constexpr Tag kCreditNoteTag = ~Tag{0};
constexpr uint64_t kCreditNoteMeta = 0x6372656469742121ull;  // "credit!!"

}  // namespace

bool Engine::short_of_credit_locked(const Peer& p, size_t bytes) const {
  const uint64_t unanswered = p.eager_sent > p.eager_taken ? p.eager_sent - p.eager_taken : 0;
  return unanswered + bytes > config_.unexpected_bytes;
}

bool Engine::is_credit_note(const transport::Header& hdr) {
  return hdr.tag == kCreditNoteTag && hdr.meta == kCreditNoteMeta;
}

void Engine::on_credit_note(int src, const void* payload, size_t bytes) {
  uint64_t taken = 0;
  const std::string who = "rank " + std::to_string(src);
  if (!payload || bytes != sizeof(taken))
    throw ProtocolError(who + " sent a credit note of " + std::to_string(bytes) + " B" + (payload ? "" : " as a rendezvous") +
                        ", expected an eager note of " + std::to_string(sizeof(taken)) + " B");
  std::memcpy(&taken, payload, sizeof(taken));
  Peer& p = peers_[src];
  // It can only have taken what was sent: more would let our sends run past the room it promised.
  if (taken > p.eager_sent)
    throw ProtocolError(who + " says it took " + std::to_string(taken) + " eager bytes, but only " +
                        std::to_string(p.eager_sent) + " were sent to it");
  if (taken > p.eager_taken) p.eager_taken = taken;
}

void Engine::received_eager_locked(int src, size_t bytes) {
  Peer& p = peers_[src];
  if (!p.credited) return;
  p.eager_received += bytes;
  credits_due_ = true;
}

void Engine::return_credits_locked() {
  credits_due_ = false;
  const uint64_t batch = config_.unexpected_bytes / 4;
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[q];
    if (!p.credited || p.dead || p.send_closed || !p.send || q == rank_) continue;
    const uint64_t taken = p.eager_received - queues_.unexpected_bytes_from(q);
    if (taken - p.eager_told < std::max<uint64_t>(batch, 1)) continue;
    if (!p.credit_note) p.credit_note = std::make_unique<CreditNote>();
    CreditNote& n = *p.credit_note;
    if (n.posted) {  // one note at a time: the next one goes once this one has left
      credits_due_ = true;
      continue;
    }
    n.taken = taken;
    n.op = transport::SendOp{};
    n.op.hdr = transport::Header{kCreditNoteTag, kCreditNoteMeta, sizeof(n.taken), 0};
    n.op.buf = &n.taken;
    n.posted = true;
    p.eager_told = taken;
    ++counters_.credit_notes_sent;
    try {
      p.send->post(&n.op);
    } catch (const PeerError& e) {
      peer_lost(q, e.what());
    }
  }
}

bool Engine::credit_note_sent(transport::SendOp* op) {
  if (!is_credit_note(op->hdr)) return false;
  for (auto& p : peers_)
    if (p.credit_note && &p.credit_note->op == op) p.credit_note->posted = false;
  credits_due_ = true;  // what was taken meanwhile may be due now
  return true;
}

}  // namespace dicomm
