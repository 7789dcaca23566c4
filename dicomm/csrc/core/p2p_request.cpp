#include "core/p2p_request.h"

#include "core/engine.h"

namespace dicomm {

void throw_error(ErrorKind kind, const std::string& text) {
  switch (kind) {
    case ErrorKind::kTimeout: throw TimeoutError(text);
    case ErrorKind::kMismatch: throw MismatchError(text);
    case ErrorKind::kValue: throw ValueError(text);
    default: throw PeerError(text);
  }
}

std::string describe_tag(Tag tag) {
  if (!(tag & kCollectiveTagBit)) return "tag " + std::to_string(tag);
  uint64_t seq = (tag >> 20) & ((uint64_t{1} << 43) - 1);
  return "collective tag (seq " + std::to_string(seq) + ", step " + std::to_string(tag & 0xFFFFF) + ")";
}

P2PRequest::P2PRequest(std::shared_ptr<Engine> engine, Op op_, int peer_, Tag tag_, uint64_t meta_, void* buf_,
                       size_t bytes)
    : op(op_), peer(peer_), tag(tag_), meta(meta_), buf(buf_), capacity(bytes), engine_(std::move(engine)) {
  if (op == Op::kSend) nbytes_ = bytes;
}

bool P2PRequest::test() {
  if (!done()) engine_->poke();
  rethrow_if_failed();
  return done();
}

void P2PRequest::wait(std::chrono::milliseconds timeout) { engine_->wait(*this, timeout); }

void P2PRequest::wait_unless(std::chrono::milliseconds timeout, const std::function<bool()>& give_up) {
  engine_->wait(*this, timeout, &give_up);
}

std::chrono::milliseconds P2PRequest::default_timeout() const { return engine_->timeout(); }

std::string P2PRequest::describe() const {
  std::string who = peer == kAnySource ? "any rank" : "rank " + std::to_string(peer);
  std::string text = op == Op::kSend ? "send to " + who : "recv from " + who;
  return text + " " + describe_tag(tag) + " (" + std::to_string(capacity) + " B)";
}

void P2PRequest::complete(int source, size_t nbytes) {
  source_ = source;
  nbytes_ = nbytes;
  state_.store(kDone, std::memory_order_release);
}

void P2PRequest::fail(ErrorKind kind, const std::string& text) {
  if (done()) return;
  error_kind_ = kind;
  error_ = text;
  state_.store(kFailed, std::memory_order_release);
}

void P2PRequest::rethrow_if_failed() const {
  if (failed()) throw_error(error_kind_, error_);
}

}  // namespace dicomm
