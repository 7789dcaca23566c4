#include "transport/tcp/tcp_conn.h"

#include <algorithm>

#include "core/types.h"
#include "transport/socket.h"

namespace dicomm::transport::tcp {
namespace {
const char kEmpty[1] = {0};
}

TcpSendConn::TcpSendConn(int peer, std::vector<std::unique_ptr<TcpStream>> streams, Sink* sink,
                         size_t chunk_bytes)
    : peer_(peer), streams_(std::move(streams)), sink_(sink), chunk_bytes_(chunk_bytes) {}

void TcpSendConn::post(SendOp* op) {
  op->hdr.msg_id = next_id_++;
  Frame f;
  f.msg_id = op->hdr.msg_id;
  f.tag = op->hdr.tag;
  f.meta = op->hdr.meta;
  f.tag_seq = op->hdr.tag_seq;
  f.bytes = op->hdr.bytes;
  op->rendezvous |= op->hdr.bytes > kEagerLimit;
  if (!op->rendezvous) {
    f.kind = kEager;
    streams_[0]->send(f, static_cast<const char*>(op->buf), op, *this);
  } else {
    f.kind = kRts;
    rendezvous_[f.msg_id] = Rendezvous{op, 0, false};
    streams_[0]->send(f, nullptr, nullptr, *this);
  }
}

bool TcpSendConn::progress(bool thorough) {
  // Reads cost a syscall each: only where something is expected (clear-to-send and refusals on
  // stream 0 while a rendezvous is open), and everywhere on thorough passes (to see EOF).
  bool did = false;
  for (size_t i = 0; i < streams_.size(); ++i) {
    TcpStream& s = *streams_[i];
    if (s.has_output()) did |= s.flush(*this);
    if (thorough || (i == 0 && !rendezvous_.empty())) did |= s.read(*this);
    if (s.eof()) throw ConnectionClosed(s.eof_reason());
  }
  return did;
}

void TcpSendConn::on_frame(const Frame& f, const char*) {
  auto it = rendezvous_.find(f.msg_id);
  if ((f.kind != kCts && f.kind != kRefuse) || it == rendezvous_.end())
    throw ProtocolError(streams_[0]->what() + ": frame kind " + std::to_string(f.kind) + " for message " +
                        std::to_string(f.msg_id) + ", which awaits no clear-to-send or refusal");
  // Once cleared, its data frames point into the sender's buffer until written: a second
  // clear-to-send or a late refusal would complete the send under them.
  if (it->second.cleared)
    throw ProtocolError(streams_[0]->what() + ": a second answer (kind " + std::to_string(f.kind) + ") for message " +
                        std::to_string(f.msg_id) + ", already cleared to send");
  SendOp* op = it->second.op;
  if (f.kind == kRefuse) {
    rendezvous_.erase(it);
    sink_->on_send_refused(op, Refusal{f.code, f.bytes, f.meta});
    return;
  }
  it->second.cleared = true;
  // Stripe: chunks of at most chunk_bytes_, round-robin over the streams.
  size_t bytes = op->hdr.bytes;
  size_t n = streams_.size();
  size_t chunk = std::max<size_t>(std::min(chunk_bytes_, (bytes + n - 1) / n), 64 * 1024);
  size_t chunks = (bytes + chunk - 1) / chunk;
  it->second.chunks_left = chunks;
  const char* base = static_cast<const char*>(op->buf);
  for (size_t off = 0; off < bytes; off += chunk) {
    Frame d;
    d.kind = kData;
    d.msg_id = f.msg_id;
    d.offset = off;
    d.bytes = std::min(chunk, bytes - off);
    streams_[next_stream_++ % n]->send(d, base + off, nullptr, *this);
  }
}

char* TcpSendConn::data_target(const Frame&) {
  throw ProtocolError(streams_[0]->what() + ": data frame on a send connection");
}

void TcpSendConn::on_written(const Frame& f, void* cookie) {
  if (f.kind == kEager) {
    sink_->on_send_done(static_cast<SendOp*>(cookie));
  } else if (f.kind == kData) {
    auto it = rendezvous_.find(f.msg_id);
    if (it != rendezvous_.end() && --it->second.chunks_left == 0) {
      SendOp* op = it->second.op;
      rendezvous_.erase(it);
      sink_->on_send_done(op);
    }
  }
}

TcpRecvConn::TcpRecvConn(int peer, int nstreams, Sink* sink, int64_t peer_pid)
    : peer_(peer), peer_pid_(peer_pid), streams_(static_cast<size_t>(nstreams)), sink_(sink) {}

bool TcpRecvConn::cancel(RecvOp* op) {
  for (auto& [id, l] : landing_) {
    if (l.op != op || l.discard) continue;
    l.discard = true;  // frames still to come are read into scratch memory
    for (auto& s : streams_)
      if (s) s->drop_data_into(static_cast<const char*>(op->buf), static_cast<const char*>(op->buf) + op->bytes);
    return true;
  }
  return false;
}

bool TcpRecvConn::attach(int index, std::unique_ptr<TcpStream> stream) {
  if (index < 0 || index >= nstreams() || streams_[index]) return false;
  streams_[index] = std::move(stream);
  return true;
}

bool TcpRecvConn::progress(bool thorough) {
  bool did = false;
  // A sender that finished and closed ends each stream in turn: only when every stream has
  // ended (each one drained first) is the peer gone. A dead peer ends them all at once.
  size_t ended = 0, attached = 0;
  const std::string* reason = nullptr;
  for (size_t i = 0; i < streams_.size(); ++i) {
    auto& s = streams_[i];
    if (!s) continue;
    ++attached;
    if (s->has_output()) did |= s->flush(*this);
    // Data streams carry nothing until we have asked for data (or on thorough passes: EOF).
    reading_ = static_cast<int>(i);
    if (i == 0 || thorough || !landing_.empty()) did |= s->read(*this);
    if (s->eof()) {
      ++ended;
      reason = &s->eof_reason();
    }
  }
  if (reason && ended == attached) throw ConnectionClosed(*reason);
  return did;
}

void TcpRecvConn::on_frame(const Frame& f, const char* payload) {
  // Announcements travel on stream 0 only: the answers (pull, refuse) go back on it.
  if (reading_ != 0)
    throw ProtocolError(who() + ": frame kind " + std::to_string(f.kind) + " on data stream " +
                        std::to_string(reading_));
  Header h{f.tag, f.meta, f.bytes, f.msg_id, f.tag_seq};
  if (f.kind == kEager) {
    sink_->on_message(*this, h, payload ? payload : kEmpty);
  } else if (f.kind == kRts) {
    // An id announced again before its answer would land two receives' data under one id.
    if (!announced_.insert(f.msg_id).second || landing_.count(f.msg_id))
      throw ProtocolError(who() + ": message " + std::to_string(f.msg_id) + " announced again before it was answered");
    sink_->on_message(*this, h, nullptr);
  } else {
    throw ProtocolError(who() + ": frame kind " + std::to_string(f.kind) + " on a receive connection");
  }
}

char* TcpRecvConn::data_target(const Frame& f) {
  auto it = landing_.find(f.msg_id);
  if (it == landing_.end())
    throw ProtocolError(who() + ": data frame for message " + std::to_string(f.msg_id) +
                        ", which no receive has cleared to send");
  Landing& l = it->second;
  // Each side of every comparison stays within [0, l.bytes]: no sum of wire values that could wrap.
  // A frame claims its bytes when its header is read, so frames on other streams that overlap it
  // cannot complete the receive (and give its buffer back) while it is still landing.
  if (f.offset > l.bytes || f.bytes > l.bytes - f.offset || f.bytes > l.bytes - l.claimed)
    throw ProtocolError(who() + ": data frame of " + std::to_string(f.bytes) + " B at offset " +
                        std::to_string(f.offset) + " for message " + std::to_string(f.msg_id) + ", outside the " +
                        std::to_string(l.bytes) + " B posted for it (" + std::to_string(l.bytes - l.claimed) +
                        " B not yet claimed by earlier frames)");
  l.claimed += f.bytes;
  if (l.discard) return nullptr;
  return static_cast<char*>(l.op->buf) + f.offset;
}

void TcpRecvConn::on_data(const Frame& f) {
  auto it = landing_.find(f.msg_id);
  if (it == landing_.end()) return;  // data_target checked it: only a bug could get here
  it->second.landed += f.bytes;  // data_target checked that the claims stay within bytes
  if (it->second.landed == it->second.bytes) {
    RecvOp* op = it->second.op;
    bool discard = it->second.discard;
    landing_.erase(it);
    if (!discard) sink_->on_recv_done(op);
  }
}

void TcpRecvConn::pull(uint64_t msg_id, RecvOp* op) {
  announced_.erase(msg_id);
  landing_[msg_id] = Landing{op, 0, 0, op->bytes, false};
  Frame f;
  f.kind = kCts;
  f.msg_id = msg_id;
  streams_[0]->send(f, nullptr, nullptr, *this);
}

void TcpRecvConn::refuse(uint64_t msg_id, const Refusal& why) {
  announced_.erase(msg_id);
  Frame f;
  f.kind = kRefuse;
  f.code = why.code;
  f.msg_id = msg_id;
  f.bytes = why.recv_bytes;
  f.meta = why.recv_meta;
  streams_[0]->send(f, nullptr, nullptr, *this);
}

}  // namespace dicomm::transport::tcp
