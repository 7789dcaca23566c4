#include "collectives/session.h"

#include <algorithm>

#include "collectives/tuning.h"
#include "core/types.h"

namespace dicomm {
namespace {

// Zero-byte messages still travel (they carry the signature); give them a valid address.
uint8_t g_empty_byte = 0;

}  // namespace

Session::Session(Communicator& comm, uint64_t seq, std::string what, uint64_t meta)
    : comm_(comm),
      rank_(comm.rank()),
      size_(comm.size()),
      seq_(seq),
      what_(std::move(what)),
      meta_(meta),
      tuning_(Tuning::of(comm.config())),
      deadline_(std::chrono::steady_clock::now() + comm.timeout()) {}

Transfer Session::post(bool is_recv, int peer, void* buf, size_t bytes, uint32_t step,
                       uint64_t meta) {
  if (step >= kMaxTagSteps)
    throw Error(what_ + ": internal error, tag step " + std::to_string(step) + " out of range");
  if (bytes == 0 || buf == nullptr) buf = &g_empty_byte;
  const Tag tag = collective_tag(seq_, step);
  Transfer t;
  t.request = is_recv ? comm_.irecv(buf, bytes, peer, tag, meta)
                      : comm_.isend(buf, bytes, peer, tag, meta);
  t.peer = peer;
  t.bytes = bytes;
  t.is_recv = is_recv;
  t.step = step;
  posted_.push_back(t.request);
  return t;
}

Transfer Session::send(int peer, const void* buf, size_t bytes, uint32_t step) {
  return post(false, peer, const_cast<void*>(buf), bytes, step, meta_);
}
Transfer Session::recv(int peer, void* buf, size_t bytes, uint32_t step) {
  return post(true, peer, buf, bytes, step, meta_);
}
Transfer Session::send(int peer, const void* buf, size_t bytes, uint32_t step, uint64_t meta) {
  return post(false, peer, const_cast<void*>(buf), bytes, step, meta);
}
Transfer Session::recv(int peer, void* buf, size_t bytes, uint32_t step, uint64_t meta) {
  return post(true, peer, buf, bytes, step, meta);
}

void Session::wait(Transfer& t) {
  if (t.done) return;
  check_posted();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline_ - std::chrono::steady_clock::now());
  try {
    t.request->wait(std::max(left, std::chrono::milliseconds(0)));
  } catch (const TimeoutError& e) {
    // Worded as the caller's own wait words it ("Timed out after N ms waiting for X"): which of the two
    // deadlines passes first is a race, and callers (torch's tests among them) match the wording.
    throw TimeoutError("Timed out after " + std::to_string(comm_.timeout().count()) + " ms waiting for " + what_ +
                       ": rank " + std::to_string(t.peer) + " never answered step " + std::to_string(t.step) +
                       " (" + e.what() + ")");
  }
  if (t.is_recv && t.request->nbytes() != t.bytes)
    throw MismatchError("expected " + std::to_string(t.bytes) + " B from rank " +
                        std::to_string(t.peer) + ", received " +
                        std::to_string(t.request->nbytes()) +
                        " B (did the ranks pass different sizes?)");
  t.done = true;
}

void Session::wait_all() {
  const auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline_ - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(0));
  };
  check_posted();
  for (const auto& r : posted_) r->wait(left());
}

void Session::check_posted() {
  for (; checked_ < posted_.size(); ++checked_) posted_[checked_]->test();
}

uint8_t* Session::scratch(size_t bytes) {
  scratch_.emplace_back(new uint8_t[std::max<size_t>(bytes, 1)]);
  return scratch_.back().get();
}

void Session::fail(const std::exception_ptr& error) {
  const std::string prefix = what_ + " failed on rank " + std::to_string(rank_) + ": ";
  std::string reason = prefix;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    reason += e.what();
  } catch (...) {
    reason += "unknown error";
  }
  ErrorKind kind = ErrorKind::kPeer;
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError&) {
    kind = ErrorKind::kMismatch;
  } catch (const TimeoutError&) {
    kind = ErrorKind::kTimeout;
  } catch (...) {
  }
  comm_.abort_with(reason, kind, seq_);  // the peers' pending requests fail with the same class of error
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError&) {
    throw MismatchError(reason);
  } catch (const TimeoutError&) {
    throw TimeoutError(reason);
  } catch (const PeerError&) {
    throw PeerError(reason);
  } catch (const ValueError&) {
    throw ValueError(reason);
  } catch (const Error&) {
    throw Error(reason);
  }
  // Anything else (std::bad_alloc, ...) goes out unchanged.
}

}  // namespace dicomm
