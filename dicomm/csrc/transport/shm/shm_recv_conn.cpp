// The receiving side of a shared-memory pair.
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
constexpr size_t kCopyStep = 4 * 1024 * 1024;  // per progress call, so waits notice deadlines
constexpr int kChunksPerStep = 8;
const char kEmpty[1] = {0};
}  // namespace


ShmRecvConn::ShmRecvConn(int peer, std::unique_ptr<ControlSocket> control, std::unique_ptr<Mapping> map,
                         Sink* sink, int peer_pid, bool cma, bool split)
    : peer_(peer), control_(std::move(control)), map_(std::move(map)), seg_(map_->get()), sink_(sink),
      peer_pid_(peer_pid), cma_(cma), split_(split) {}

bool ShmRecvConn::read_slots() {
  bool did = false;
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& s = seg_->slots[consumed_ % kSlots];
    if (s.seq.load(std::memory_order_acquire) != consumed_ + 1) break;
    // The sender may rewrite the slot while we read it: every field is read once, then checked.
    const uint32_t kind = s.kind;
    Header h{s.tag, s.meta, s.bytes, s.msg_id, static_cast<uint32_t>(s.tag_seq)};
    if (kind == kEager) {
      if (h.bytes > kSlotPayload)
        throw ProtocolError(control_->what() + ": eager slot of " + std::to_string(h.bytes) + " B, a slot holds " +
                            std::to_string(kSlotPayload) + " B");
      sink_->on_message(*this, h, h.bytes ? s.payload : kEmpty);  // the engine copies it out
    } else if (kind == kRts) {
      if (!announced_.emplace(h.msg_id, s.addr).second)
        throw ProtocolError(control_->what() + ": message " + std::to_string(h.msg_id) +
                            " announced again before it was answered");
      sink_->on_message(*this, h, nullptr);
    } else {
      throw ProtocolError(control_->what() + ": slot of unknown kind " + std::to_string(kind));
    }
    seg_->slots_consumed.store(++consumed_, std::memory_order_release);
    did = true;
  }
  if (did) control_->ring_if_sleeping(seg_->sender_sleeping);
  return did;
}

void ShmRecvConn::pull(uint64_t msg_id, RecvOp* op) {
  auto it = announced_.find(msg_id);
  if (it == announced_.end()) throw ProtocolError(control_->what() + ": pull of unannounced message " + std::to_string(msg_id));
  Pull p{op, msg_id, it->second, 0, -1, 0, op->bytes};
  announced_.erase(it);
  if (cma_) {
    // Big enough to split: offer the sender a share of the copy.
    for (size_t i = 0; i < kShares && split_ && op->bytes >= 2 * kShareChunk; ++i) {
      if (share_used_[i]) continue;
      Share& s = seg_->shares[i];
      s.dst = reinterpret_cast<uint64_t>(op->buf);
      s.bytes = op->bytes;
      s.done.store(0, std::memory_order_relaxed);
      s.returned.store(0, std::memory_order_relaxed);
      uint64_t gen = next_generation_++ & 0xffffffffu;
      if (gen == 0) gen = next_generation_++ & 0xffffffffu;
      s.claim.store(gen << 32, std::memory_order_release);
      share_used_[i] = true;
      p.share = static_cast<int>(i);
      p.generation = gen;
      ack(kHelp, msg_id, static_cast<uint32_t>(i), gen);
      break;
    }
    pulls_.push_back(p);
  } else {
    piped_.push_back(p);
    ack(kCts, msg_id);
  }
}

void ShmRecvConn::refuse(uint64_t msg_id, const Refusal& why) {
  announced_.erase(msg_id);
  ack(kRefuse, msg_id, why.code, why.recv_bytes, why.recv_meta);
}

bool ShmRecvConn::withdraw_share(int share) {
  // The sender raises `writing` before it claims a chunk: once the claim is gone and `writing` is
  // down, no write of its can land (a later claim fails on the cleared generation).
  Share& s = seg_->shares[share];
  s.claim.store(0, std::memory_order_seq_cst);
  auto until = Clock::now() + std::chrono::milliseconds(200);
  while (s.writing.load(std::memory_order_seq_cst)) {
    if (Clock::now() >= until) return false;  // a stopped sender: the share stays out of use
    sched_yield();
  }
  share_used_[share] = false;
  return true;
}

bool ShmRecvConn::cancel(RecvOp* op) {
  for (auto it = pulls_.begin(); it != pulls_.end(); ++it) {
    if (it->op != op) continue;
    const bool stopped = it->share < 0 || withdraw_share(it->share);
    const uint64_t id = it->msg_id;
    pulls_.erase(it);  // this side reads no more of it either way
    ack(kRefuse, id, Refusal::kLate);
    return stopped;
  }
  for (Pull& p : piped_) {
    if (p.op != op || p.dropped) continue;
    p.dropped = true;  // the sender streams on; its chunks go nowhere
    p.op = nullptr;
    return true;
  }
  return false;
}

ShmRecvConn::~ShmRecvConn() {
  // Withdraw every share: a sender's write in progress ends before the buffers go.
  for (size_t i = 0; i < kShares; ++i)
    if (share_used_[i]) withdraw_share(static_cast<int>(i));
}

void ShmRecvConn::read_exact(char* dst, uint64_t src, size_t n) {
  size_t done = 0;
  while (done < n) {
    iovec local{dst + done, n - done};
    iovec remote{reinterpret_cast<void*>(src + done), n - done};
    ssize_t r = process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
    if (r <= 0) {
      int err = r < 0 ? errno : EIO;
      if (err == EINTR) continue;
      throw PeerError(control_->what() + ": reading the sender's buffer failed: " + errno_text(err) +
                      (err == ESRCH ? " (the sender exited mid-transfer)" : ""));
    }
    done += static_cast<size_t>(r);
  }
}

bool ShmRecvConn::copy_shared(Pull& p) {
  Share& s = seg_->shares[p.share];
  const size_t bytes = p.op->bytes;
  const uint64_t chunks = (bytes + kShareChunk - 1) / kShareChunk;
  char* dst = static_cast<char*>(p.op->buf);
  bool did = false;
  for (int i = 0; i < 4; ++i) {
    uint64_t c = s.claim.load(std::memory_order_acquire);
    const uint64_t k = c & 0xffffffffu;
    if (k >= chunks) break;
    if (!s.claim.compare_exchange_strong(c, c + 1, std::memory_order_acq_rel)) continue;
    const size_t off = k * kShareChunk, len = std::min(kShareChunk, bytes - off);
    read_exact(dst + off, p.src + off, len);
    s.done.fetch_add(len, std::memory_order_acq_rel);
    did = true;
  }
  if (uint64_t back = s.returned.exchange(0, std::memory_order_acq_rel)) {
    // The sender names the chunk it hands back: one outside this message is a write we never posted.
    if (back > chunks)
      throw ProtocolError(control_->what() + ": sender handed back chunk " + std::to_string(back - 1) + " of a " +
                          std::to_string(chunks) + "-chunk message");
    const size_t off = (back - 1) * kShareChunk, len = std::min(kShareChunk, bytes - off);
    read_exact(dst + off, p.src + off, len);
    s.done.fetch_add(len, std::memory_order_acq_rel);
    did = true;
  }
  if (s.done.load(std::memory_order_acquire) < bytes) return did;  // the sender still copies
  s.claim.store(0, std::memory_order_release);
  share_used_[p.share] = false;
  RecvOp* op = p.op;
  uint64_t id = p.msg_id;
  pulls_.pop_front();
  ack(kFin, id);
  sink_->on_recv_done(op);
  return true;
}

bool ShmRecvConn::copy_step() {
  if (pulls_.empty()) return false;
  Pull& p = pulls_.front();
  if (p.share >= 0) return copy_shared(p);
  size_t n = std::min(kCopyStep, p.op->bytes - p.done);
  iovec local{static_cast<char*>(p.op->buf) + p.done, n};
  iovec remote{reinterpret_cast<void*>(p.src + p.done), n};
  ssize_t r = process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
  if (r <= 0) {
    int err = r < 0 ? errno : EIO;
    if (err == EINTR) return false;
    throw PeerError(control_->what() + ": reading the sender's buffer failed: " + errno_text(err) +
                    (err == ESRCH ? " (the sender exited mid-transfer)" : ""));
  }
  p.done += static_cast<size_t>(r);
  if (p.done == p.op->bytes) {
    RecvOp* op = p.op;
    uint64_t id = p.msg_id;
    pulls_.pop_front();
    ack(kFin, id);
    sink_->on_recv_done(op);
  }
  return true;
}

bool ShmRecvConn::read_chunks() {
  bool did = false;
  for (int i = 0; i < kChunksPerStep; ++i) {
    Chunk& c = seg_->chunks[chunks_consumed_ % kChunks];
    if (c.seq.load(std::memory_order_acquire) != chunks_consumed_ + 1) break;
    // Read once, then checked without sums that could wrap: the sender may rewrite them meanwhile.
    const uint64_t id = c.msg_id, offset = c.offset, len = c.len;
    if (piped_.empty() || piped_.front().msg_id != id)
      throw ProtocolError(control_->what() + ": chunk for message " + std::to_string(id) + ", which was not cleared to stream");
    Pull& p = piped_.front();
    if (len > kChunkBytes || offset > p.bytes || len > p.bytes - offset || len > p.bytes - p.done)
      throw ProtocolError(control_->what() + ": chunk of " + std::to_string(len) + " B at offset " + std::to_string(offset) +
                          " for message " + std::to_string(id) + ", outside the " + std::to_string(p.bytes) +
                          " B posted for it (" + std::to_string(p.bytes - p.done) + " B still due; a chunk holds " +
                          std::to_string(kChunkBytes) + " B)");
    if (!p.dropped) std::memcpy(static_cast<char*>(p.op->buf) + offset, c.data, len);
    p.done += len;
    seg_->chunks_consumed.store(++chunks_consumed_, std::memory_order_release);
    did = true;
    if (p.done == p.bytes) {
      RecvOp* op = p.op;
      piped_.pop_front();
      if (op) sink_->on_recv_done(op);
    }
  }
  if (did) control_->ring_if_sleeping(seg_->sender_sleeping);
  return did;
}

void ShmRecvConn::ack(uint32_t kind, uint64_t msg_id, uint32_t code, uint64_t bytes, uint64_t meta) {
  unsent_acks_.push_back(PendingAck{kind, code, msg_id, bytes, meta});
  flush_acks();
}

bool ShmRecvConn::flush_acks() {
  bool did = false;
  while (!unsent_acks_.empty() &&
         acks_published_ - seg_->acks_consumed.load(std::memory_order_acquire) < kAcks) {
    const PendingAck& p = unsent_acks_.front();
    Ack& a = seg_->acks[acks_published_ % kAcks];
    a.kind = p.kind;
    a.code = p.code;
    a.msg_id = p.msg_id;
    a.bytes = p.bytes;
    a.meta = p.meta;
    a.seq.store(++acks_published_, std::memory_order_release);
    unsent_acks_.pop_front();
    did = true;
  }
  if (did) control_->ring_if_sleeping(seg_->sender_sleeping);
  return did;
}

bool ShmRecvConn::progress(bool thorough) {
  bool did = read_slots();
  did |= copy_step();
  did |= read_chunks();
  did |= flush_acks();
  if (thorough && !control_->drain()) {
    // What the peer published before it went (messages, pipeline chunks) is still ours.
    while (true) {
      const bool slots = read_slots();
      const bool chunks = read_chunks();  // both run on every pass
      if (!slots && !chunks) break;
      did = true;
    }
    throw ConnectionClosed(control_->what() + ": peer closed the control socket (it exited or closed its communicator)");
  }
  return did;
}

bool ShmRecvConn::arm() {
  seg_->receiver_sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool ready = seg_->slots[consumed_ % kSlots].seq.load(std::memory_order_acquire) == consumed_ + 1 ||
               seg_->chunks[chunks_consumed_ % kChunks].seq.load(std::memory_order_acquire) == chunks_consumed_ + 1;
  if (ready || busy()) {
    disarm();
    return false;
  }
  return true;
}

void ShmRecvConn::disarm() {
  if (seg_->receiver_sleeping.load(std::memory_order_relaxed)) seg_->receiver_sleeping.store(0, std::memory_order_relaxed);
}

}  // namespace dicomm::transport::shm
