#include "transport/verbs/verbs_conn.h"

#include <algorithm>

#include "core/types.h"

namespace dicomm::transport::verbs {
namespace {
const char kEmpty[1] = {0};
constexpr int kStageSlots = 4;  // chunks of the CPU-mediated path in flight per connection
}  // namespace

std::string PathStats::describe() const {
  if (device_direct && cpu_mediated) return "verbs/device-direct+cpu-mediated";
  if (device_direct) return "verbs/device-direct";
  if (cpu_mediated) return "verbs/cpu-mediated";
  return "verbs";
}

// ---------------------------------------------------------------- send side

VerbsSendConn::VerbsSendConn(int peer, std::unique_ptr<Channel> ch, Sink* sink, size_t chunk_bytes)
    : peer_(peer), ch_(std::move(ch)), sink_(sink), chunk_(chunk_bytes) {}

VerbsSendConn::~VerbsSendConn() {
  ch_.reset();  // drains first: the peer may still be reading our buffers
}

void VerbsSendConn::post(SendOp* op) {
  op->hdr.msg_id = next_id_++;
  Ctrl c;
  c.msg_id = op->hdr.msg_id;
  c.tag = op->hdr.tag;
  c.meta = op->hdr.meta;
  c.tag_seq = op->hdr.tag_seq;
  c.bytes = op->hdr.bytes;
  if (op->hdr.bytes <= ch_->eager_limit() && !Accel::get().is_device(op->buf)) {
    c.kind = kEager;
    ch_->send_ctrl(c, op->buf, op->hdr.bytes);  // copied (or queued with a copy): done
    sink_->on_send_done(op);
    return;
  }
  c.kind = kRts;
  Rendezvous r{op, nullptr, nullptr};
  Nic& nic = ch_->nic();
  r.reg = nic.cache().acquire(op->buf, op->hdr.bytes);
  if (r.reg->mr) {
    c.addr = reinterpret_cast<uintptr_t>(op->buf);
    c.rkey = r.reg->rkey();
    r.ready = op->hdr.bytes;
    path_.device_direct |= r.reg->device;
  } else {  // CPU-mediated: the peer reads a registered host copy, made one chunk at a time
    r.staged = std::make_unique<HostBuffer>(nic, op->hdr.bytes);
    r.ready = std::min(chunk_, op->hdr.bytes);
    copy_in(r.staged->data(), op->buf, r.ready, r.reg->device);
    if (r.ready < op->hdr.bytes) ++staging_;
    c.addr = reinterpret_cast<uintptr_t>(r.staged->data());
    c.rkey = r.staged->rkey();
    path_.cpu_mediated = true;
  }
  c.ready = r.ready;
  rendezvous_.emplace(c.msg_id, std::move(r));
  ch_->send_ctrl(c);
}

void VerbsSendConn::on_ctrl(const Ctrl& c, const char*) {
  auto it = rendezvous_.find(c.msg_id);
  if ((c.kind != kFin && c.kind != kRefuse) || it == rendezvous_.end())
    throw ProtocolError(ch_->what() + ": unexpected control message kind " + std::to_string(c.kind) + " for message " +
                    std::to_string(c.msg_id));
  SendOp* op = it->second.op;
  if (it->second.staged && it->second.ready < op->hdr.bytes) --staging_;  // refused before fully staged
  ch_->nic().cache().release(it->second.reg);
  rendezvous_.erase(it);
  if (c.kind == kFin) sink_->on_send_done(op);
  else sink_->on_send_refused(op, Refusal{c.code, c.bytes, c.meta});
}

bool VerbsSendConn::progress(bool thorough) {
  bool did = ch_->progress(*this, thorough);
  if (staging_ > 0) did |= stage_more();
  return did;
}

bool VerbsSendConn::stage_more() {
  bool did = false;
  for (auto& [id, r] : rendezvous_) {
    const size_t bytes = r.op->hdr.bytes;
    if (!r.staged || r.ready >= bytes) continue;
    const size_t n = std::min(chunk_, bytes - r.ready);
    copy_in(r.staged->data() + r.ready, static_cast<const char*>(r.op->buf) + r.ready, n, r.reg->device);
    r.ready += n;
    if (r.ready == bytes) --staging_;
    Ctrl c;
    c.kind = kReady;
    c.msg_id = id;
    c.ready = r.ready;
    ch_->send_ctrl(c);
    did = true;
  }
  return did;
}

// ---------------------------------------------------------------- receive side

VerbsRecvConn::VerbsRecvConn(int peer, std::unique_ptr<Channel> ch, Sink* sink, size_t chunk_bytes)
    : peer_(peer), ch_(std::move(ch)), sink_(sink), chunk_(chunk_bytes) {}

VerbsRecvConn::~VerbsRecvConn() {
  ch_.reset();  // outstanding reads finish (or time out) before their buffers are released
}

bool VerbsRecvConn::progress(bool thorough) {
  bool did = ch_->progress(*this, thorough);
  did |= issue_reads();
  return did;
}

void VerbsRecvConn::on_ctrl(const Ctrl& c, const char* payload) {
  Header h{c.tag, c.meta, c.bytes, c.msg_id, c.tag_seq};
  if (c.kind == kEager) {
    sink_->on_message(*this, h, c.bytes ? payload : kEmpty);
  } else if (c.kind == kRts) {
    const bool pulling = std::any_of(pulls_.begin(), pulls_.end(), [&](const Pull& p) { return p.msg_id == c.msg_id; });
    if (pulling || !announced_.emplace(c.msg_id, Announced{c.addr, c.rkey, c.bytes, std::min(c.ready, c.bytes)}).second)
      throw ProtocolError(ch_->what() + ": message " + std::to_string(c.msg_id) + " announced again before it was answered");
    sink_->on_message(*this, h, nullptr);
  } else if (c.kind == kReady) {  // more of a staged message may be read
    auto a = announced_.find(c.msg_id);
    if (a != announced_.end()) {
      a->second.ready = std::max(a->second.ready, std::min(c.ready, a->second.bytes));
      return;
    }
    // Being pulled: read further. Neither announced nor pulled: refused already, nothing to do.
    for (auto& p : pulls_)
      if (p.msg_id == c.msg_id) p.src.ready = std::max(p.src.ready, c.ready);
    issue_reads();
  } else {
    throw ProtocolError(ch_->what() + ": unexpected control message kind " + std::to_string(c.kind));
  }
}

void VerbsRecvConn::pull(uint64_t msg_id, RecvOp* op) {
  auto it = announced_.find(msg_id);
  if (it == announced_.end()) throw ProtocolError(ch_->what() + ": pull of unknown message " + std::to_string(msg_id));
  Pull p{msg_id, op, nullptr, it->second};
  announced_.erase(it);
  p.src.bytes = op->bytes;
  p.reg = ch_->nic().cache().acquire(op->buf, op->bytes);
  if (p.reg->mr) {
    path_.device_direct |= p.reg->device;
  } else {
    path_.cpu_mediated = true;
    if (!stage_) stage_ = std::make_unique<StagingRing>(ch_->nic(), chunk_, kStageSlots);
  }
  pulls_.push_back(p);
  issue_reads();
}

bool VerbsRecvConn::issue_reads() {
  bool did = false;
  for (auto& p : pulls_) {
    const size_t readable = std::min(p.src.ready, p.src.bytes);
    while (p.issued < readable && ch_->can_read()) {
      const uint32_t len = static_cast<uint32_t>(std::min(chunk_, readable - p.issued));
      int slot = -1;
      char* dst = static_cast<char*>(p.op->buf) + p.issued;
      uint32_t lkey = p.reg->lkey();
      if (!p.reg->mr) {
        slot = stage_->take();
        if (slot < 0) return did;  // staging slots all in flight: wait for a copy-out
        dst = stage_->slot(slot);
        lkey = stage_->lkey();
      }
      uint64_t cookie = next_cookie_++;
      reads_[cookie] = Read{p.msg_id, p.issued, len, slot};
      ch_->post_read(dst, lkey, p.src.addr + p.issued, p.src.rkey, len, cookie);
      p.issued += len;
      did = true;
    }
    if (!ch_->can_read()) break;
  }
  return did;
}

void VerbsRecvConn::on_read_done(uint64_t cookie) {
  auto rit = reads_.find(cookie);
  if (rit == reads_.end()) return;
  Read rd = rit->second;
  reads_.erase(rit);
  auto pit = std::find_if(pulls_.begin(), pulls_.end(), [&](const Pull& p) { return p.msg_id == rd.pull; });
  if (pit == pulls_.end()) {  // withdrawn: its data is not wanted
    if (rd.stage_slot >= 0) stage_->give(rd.stage_slot);
    return;
  }
  if (rd.stage_slot >= 0) {
    copy_out(static_cast<char*>(pit->op->buf) + rd.offset, stage_->slot(rd.stage_slot), rd.len, pit->reg->device);
    stage_->give(rd.stage_slot);
  }
  pit->done += rd.len;
  if (pit->done < pit->src.bytes) return;
  Pull p = *pit;
  pulls_.erase(pit);
  Ctrl fin;
  fin.kind = kFin;
  fin.msg_id = p.msg_id;
  ch_->send_ctrl(fin);
  ch_->nic().cache().release(p.reg);
  sink_->on_recv_done(p.op);
}

bool VerbsRecvConn::cancel(RecvOp* op) {
  auto pit = std::find_if(pulls_.begin(), pulls_.end(), [&](const Pull& p) { return p.op == op; });
  if (pit == pulls_.end()) return false;
  const Pull p = *pit;
  pulls_.erase(pit);  // issue_reads posts nothing more for it
  std::vector<uint64_t> posted;
  for (const auto& [cookie, rd] : reads_)
    if (rd.pull == p.msg_id) posted.push_back(cookie);
  // Not settled: the registration stays taken (never deregistered under a read that may still land).
  if (!ch_->await_reads(posted)) return false;
  for (uint64_t cookie : posted) {
    auto rit = reads_.find(cookie);
    if (rit->second.stage_slot >= 0) stage_->give(rit->second.stage_slot);
    reads_.erase(rit);
  }
  ch_->nic().cache().release(p.reg);
  // A broken queue pair sends nothing: the peer learns from the connection's failure instead.
  if (!ch_->broken()) refuse(p.msg_id, Refusal{Refusal::kLate, op->bytes, 0});
  return true;
}

void VerbsRecvConn::refuse(uint64_t msg_id, const Refusal& why) {
  announced_.erase(msg_id);
  Ctrl c;
  c.kind = kRefuse;
  c.code = why.code;
  c.msg_id = msg_id;
  c.bytes = why.recv_bytes;
  c.meta = why.recv_meta;
  ch_->send_ctrl(c);
}

}  // namespace dicomm::transport::verbs
