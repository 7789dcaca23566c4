#include "transport/tcp/tcp_stream.h"

#include <algorithm>
#include <cstring>
#include <sys/uio.h>
#include <unistd.h>

#include "core/types.h"
#include "transport/socket.h"

namespace dicomm::transport::tcp {
namespace {
constexpr size_t kRxBytes = 256 * 1024;
constexpr size_t kDirectReadBytes = 64 * 1024;  // larger chunk remainders bypass the rx buffer
constexpr int kMaxIov = 16;
// Bytes moved per call at most, so one progress pass stays short (deadlines, fairness).
constexpr size_t kStepBytes = 4 * 1024 * 1024;
}  // namespace

TcpStream::TcpStream(UniqueFd fd, Poller* poller, std::string what)
    : fd_(std::move(fd)), poller_(poller), what_(std::move(what)), rx_(kRxBytes) {
  poller_->add(fd_.get());
}

void TcpStream::drop_data_into(const char* begin, const char* end) {
  if (state_ != State::kData || target_ < begin || target_ >= end) return;
  scratch_.resize(left_);
  target_ = scratch_.data();
}

TcpStream::~TcpStream() { poller_->remove(fd_.get()); }

void TcpStream::send(const Frame& f, const char* payload, void* cookie, Handler& h) {
  size_t len = (f.kind == kEager || f.kind == kData) ? f.bytes : 0;
  out_.push_back(Out{f, payload, len, 0, cookie});
  if (out_.size() == 1) flush(h);  // otherwise earlier frames are still waiting for room
}

bool TcpStream::flush(Handler& h) {
  bool did = false;
  size_t moved = 0;
  while (!out_.empty() && moved < kStepBytes) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = out_.begin(); it != out_.end() && n + 2 <= kMaxIov; ++it) {
      size_t done = it->done;
      if (done < sizeof(Frame)) {
        iov[n++] = {reinterpret_cast<char*>(&it->frame) + done, sizeof(Frame) - done};
        done = sizeof(Frame);
      }
      if (it->len > 0) iov[n++] = {const_cast<char*>(it->payload) + (done - sizeof(Frame)), it->len - (done - sizeof(Frame))};
    }
    size_t w = writev_some(fd_.get(), iov, n, what_);
    if (w == 0) break;
    did = true;
    moved += w;
    while (w > 0) {
      Out& o = out_.front();
      size_t left = sizeof(Frame) + o.len - o.done;
      if (w < left) { o.done += w; break; }
      w -= left;
      Out finished = o;
      out_.pop_front();
      h.on_written(finished.frame, finished.cookie);
    }
  }
  bool want = !out_.empty();
  if (want != want_write_) {
    poller_->want_write(fd_.get(), want);
    want_write_ = want;
  }
  return did;
}

bool TcpStream::read(Handler& h) {
  if (!violation_.empty()) throw ProtocolError(violation_);
  if (eof()) return false;
  try {
    return parse(h);
  } catch (const ConnectionClosed& e) {
    eof_reason_ = e.what();
    return true;
  } catch (const ProtocolError& e) {
    violation_ = e.what();
    throw;
  }
}

bool TcpStream::parse(Handler& h) {
  bool did = false;
  size_t moved = 0;
  for (;;) {
    // Parse what is buffered.
    for (;;) {
      size_t avail = end_ - begin_;
      if (state_ == State::kHeader) {
        if (avail < sizeof(Frame)) break;
        std::memcpy(&cur_, rx_.data() + begin_, sizeof(Frame));
        begin_ += sizeof(Frame);
        did = true;
        if (cur_.kind == kEager && cur_.bytes > 0) {
          if (cur_.bytes > kRxBytes - sizeof(Frame))
            throw ProtocolError(what_ + ": eager frame of " + std::to_string(cur_.bytes) + " B, at most " +
                                std::to_string(kRxBytes - sizeof(Frame)) + " B allowed");
          state_ = State::kPayload;
        } else if (cur_.kind == kData) {
          target_ = h.data_target(cur_);
          left_ = cur_.bytes;
          if (!target_) {  // a cancelled receive's data: read and dropped
            scratch_.resize(left_);
            target_ = scratch_.data();
          }
          state_ = State::kData;
          if (left_ == 0) { state_ = State::kHeader; h.on_data(cur_); }
        } else {
          h.on_frame(cur_, nullptr);
        }
      } else if (state_ == State::kPayload) {
        if (avail < cur_.bytes) break;
        const char* p = rx_.data() + begin_;
        begin_ += cur_.bytes;
        state_ = State::kHeader;
        h.on_frame(cur_, p);
      } else {
        size_t n = std::min(avail, left_);
        if (n == 0) break;
        std::memcpy(target_, rx_.data() + begin_, n);
        begin_ += n;
        target_ += n;
        left_ -= n;
        if (left_ > 0) break;
        state_ = State::kHeader;
        h.on_data(cur_);
      }
    }
    if (begin_ == end_) begin_ = end_ = 0;
    if (moved >= kStepBytes) return did;
    // Read more: big chunk remainders straight into their target, the rest through rx_.
    size_t got;
    if (state_ == State::kData && begin_ == end_ && left_ >= kDirectReadBytes) {
      got = read_some(fd_.get(), target_, std::min(left_, kStepBytes), what_);
      if (got == 0) return did;
      moved += got;
      target_ += got;
      left_ -= got;
      did = true;
      if (left_ == 0) { state_ = State::kHeader; h.on_data(cur_); }
      continue;
    }
    if (kRxBytes - end_ < kDirectReadBytes + sizeof(Frame)) {
      std::memmove(rx_.data(), rx_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    got = read_some(fd_.get(), rx_.data() + end_, kRxBytes - end_, what_);
    if (got == 0) return did;
    moved += got;
    end_ += got;
    did = true;
  }
}

}  // namespace dicomm::transport::tcp
