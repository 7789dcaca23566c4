// The sending side of a shared-memory pair.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/types.h"
#include "transport/shm/shm_conn.h"
#include "transport/socket.h"

namespace dicomm::transport::shm {

namespace {
constexpr int kChunksPerStep = 8;
}  // namespace


ShmSendConn::ShmSendConn(int peer, std::unique_ptr<ControlSocket> control, std::unique_ptr<Mapping> map, Sink* sink,
                         int peer_pid, std::shared_ptr<ShmCounters> counters)
    : peer_(peer), control_(std::move(control)), map_(std::move(map)), seg_(map_->get()), sink_(sink),
      peer_pid_(peer_pid), counters_(std::move(counters)), can_write_(peer_pid > 0) {}

void ShmSendConn::post(SendOp* op) {
  op->hdr.msg_id = next_id_++;
  op->rendezvous |= op->hdr.bytes > kSlotPayload;
  if (!waiting_.empty() || !publish(op)) waiting_.push_back(op);
}

bool ShmSendConn::publish(SendOp* op) {
  if (published_ - seg_->slots_consumed.load(std::memory_order_acquire) >= kSlots) return false;
  Slot& s = seg_->slots[published_ % kSlots];
  const Header& h = op->hdr;
  s.tag = h.tag;
  s.meta = h.meta;
  s.bytes = h.bytes;
  s.msg_id = h.msg_id;
  s.tag_seq = h.tag_seq;
  const bool eager = !op->rendezvous;
  s.kind = eager ? kEager : kRts;
  s.addr = reinterpret_cast<uint64_t>(op->buf);
  if (eager && h.bytes) std::memcpy(s.payload, op->buf, h.bytes);
  s.seq.store(++published_, std::memory_order_release);
  control_->ring_if_sleeping(seg_->receiver_sleeping);
  if (eager) sink_->on_send_done(op);
  else announced_[h.msg_id] = op;
  return true;
}

bool ShmSendConn::progress(bool thorough) {
  bool did = false;
  for (;;) {
    Ack& a = seg_->acks[acks_seen_ % kAcks];
    if (a.seq.load(std::memory_order_acquire) != acks_seen_ + 1) break;
    uint32_t kind = a.kind, code = a.code;
    uint64_t id = a.msg_id, bytes = a.bytes, meta = a.meta;
    seg_->acks_consumed.store(++acks_seen_, std::memory_order_release);
    did = true;
    auto it = announced_.find(id);
    if (it == announced_.end()) throw PeerError(control_->what() + ": ack for unknown message (corrupt segment)");
    SendOp* op = it->second;
    if (kind == kHelp) {
      if (can_write_ && code < kShares) helping_.push_back(Helping{op, code, bytes});
      continue;
    }
    announced_.erase(it);
    // The receiver saw every byte in place: any help still queued for op is over.
    for (auto h = helping_.begin(); h != helping_.end();) h = h->op == op ? helping_.erase(h) : h + 1;
    if (kind == kFin) sink_->on_send_done(op);
    else if (kind == kRefuse) sink_->on_send_refused(op, Refusal{code, bytes, meta});
    else streaming_.push_back(Streaming{op, 0});
  }
  while (!waiting_.empty() && publish(waiting_.front())) {
    waiting_.pop_front();
    did = true;
  }
  did |= stream_chunks();
  did |= help_step();
  if (thorough && !control_->drain())
    throw ConnectionClosed(control_->what() + ": peer closed the control socket (it exited or closed its communicator)");
  return did;
}

bool ShmSendConn::stream_chunks() {
  bool did = false;
  for (int i = 0; i < kChunksPerStep && !streaming_.empty(); ++i) {
    if (chunks_published_ - seg_->chunks_consumed.load(std::memory_order_acquire) >= kChunks) break;
    Streaming& st = streaming_.front();
    Chunk& c = seg_->chunks[chunks_published_ % kChunks];
    size_t len = std::min(kChunkBytes, st.op->hdr.bytes - st.offset);
    std::memcpy(c.data, static_cast<const char*>(st.op->buf) + st.offset, len);
    c.msg_id = st.op->hdr.msg_id;
    c.offset = st.offset;
    c.len = len;
    c.seq.store(++chunks_published_, std::memory_order_release);
    control_->ring_if_sleeping(seg_->receiver_sleeping);
    st.offset += len;
    did = true;
    if (st.offset == st.op->hdr.bytes) {
      SendOp* op = st.op;
      streaming_.pop_front();
      sink_->on_send_done(op);  // the data is in shared memory now
    }
  }
  return did;
}

bool ShmSendConn::help_step() {
  bool did = false;
  for (int i = 0; i < 4 && !helping_.empty(); ++i) {
    Helping& h = helping_.front();
    Share& s = seg_->shares[h.share];
    const uint64_t chunks = (h.op->hdr.bytes + kShareChunk - 1) / kShareChunk;
    uint64_t c = s.claim.load(std::memory_order_acquire);
    if ((c >> 32) != h.generation || (c & 0xffffffffu) >= chunks) {  // all claimed, or reused
      helping_.pop_front();
      continue;
    }
    // `writing` goes up before the claim: a receiver tearing down waits for our write to end.
    s.writing.store(1, std::memory_order_seq_cst);
    if (!s.claim.compare_exchange_strong(c, c + 1, std::memory_order_seq_cst)) {
      s.writing.store(0, std::memory_order_release);
      continue;
    }
    const uint64_t k = c & 0xffffffffu;
    const size_t off = k * kShareChunk, len = std::min(kShareChunk, h.op->hdr.bytes - off);
    size_t moved = 0;
    while (moved < len) {
      iovec local{const_cast<char*>(static_cast<const char*>(h.op->buf)) + off + moved, len - moved};
      iovec remote{reinterpret_cast<void*>(s.dst + off + moved), len - moved};
      ssize_t r = process_vm_writev(peer_pid_, &local, 1, &remote, 1, 0);
      if (r <= 0) break;
      moved += static_cast<size_t>(r);
    }
    if (moved < len) {  // not allowed (or the receiver is going): hand the chunk back, stop helping
      s.returned.store(k + 1, std::memory_order_release);
      can_write_ = false;
      helping_.clear();
    } else {
      s.done.fetch_add(len, std::memory_order_acq_rel);
      counters_->bytes_written_by_sender += static_cast<int64_t>(len);
    }
    s.writing.store(0, std::memory_order_release);
    did = true;
  }
  return did;
}

bool ShmSendConn::busy() const {
  if (!helping_.empty()) return true;
  bool slot_free = published_ - seg_->slots_consumed.load(std::memory_order_acquire) < kSlots;
  bool chunk_free = chunks_published_ - seg_->chunks_consumed.load(std::memory_order_acquire) < kChunks;
  return (!waiting_.empty() && slot_free) || (!streaming_.empty() && chunk_free) ||
         seg_->acks[acks_seen_ % kAcks].seq.load(std::memory_order_acquire) == acks_seen_ + 1;
}

bool ShmSendConn::arm() {
  // Only a sender that waits for something (slots, acks, chunk room) needs a doorbell.
  if (waiting_.empty() && announced_.empty() && streaming_.empty()) return true;
  seg_->sender_sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (busy()) {
    disarm();
    return false;
  }
  return true;
}

// Stores only when set: the peer reads this line on every publish, so do not bounce it needlessly.
void ShmSendConn::disarm() {
  if (seg_->sender_sleeping.load(std::memory_order_relaxed)) seg_->sender_sleeping.store(0, std::memory_order_relaxed);
}

}  // namespace dicomm::transport::shm
