// Fuzz target: a shared-memory receive connection (transport/shm) reading a segment its sender
// writes at will: eager slots, announcements, pipeline chunks and the handed-back chunks of a
// shared copy. The input is decoded into those events with lengths, offsets and ids from a table
// of edge values. Every rendezvous lands in a heap buffer of exactly the announced size, so
// AddressSanitizer reports any write outside it. A ProtocolError or PeerError ends an input.
#include <cstring>
#include <memory>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include "fuzz_main.h"
#include "transport/shm/shm_conn.h"
#include "transport/socket.h"

using namespace dicomm;
using namespace dicomm::transport;
using namespace dicomm::transport::shm;

namespace {

struct Reader {
  const uint8_t* p;
  size_t n;
  uint64_t u(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | (n ? (--n, *p++) : 0);
    return v;
  }
};

// `other`: the frame's other field (offset for a length), so that sums that wrap come up often.
uint64_t edge(Reader& r, uint64_t posted, uint64_t other = 0) {
  switch (r.u(1) % 12) {
    case 0: return 0;
    case 1: return 1;
    case 2: return posted;
    case 3: return posted + 1;
    case 4: return ~uint64_t{0} - r.u(1);
    case 5: return (~uint64_t{0} - posted) + 1;
    case 6: return posted / 2;
    case 7: return uint64_t{1} << (r.u(1) % 64);
    case 8: return (0 - other) + posted;      // other + this wraps to posted
    case 9: return (0 - other) + r.u(1) % (std::min<uint64_t>(posted, 1u << 20) + 1);
    default: return r.u(8);
  }
}

constexpr size_t kMaxMessage = 3 * kShareChunk;  // large enough for a shared copy
std::vector<char>& source() {  // what announcements point at: this process's own memory
  static std::vector<char> s(kMaxMessage, 'x');
  return s;
}

class FuzzSink : public transport::Sink {
 public:
  void on_accept(std::shared_ptr<RecvConn>) override {}
  void on_rejected(const std::string&) override {}
  void on_message(RecvConn& conn, const Header& h, const void* payload) override {
    if (payload) {
      std::vector<char> copy(static_cast<const char*>(payload), static_cast<const char*>(payload) + h.bytes);
      return;
    }
    if (h.bytes > kMaxMessage) return conn.refuse(h.msg_id, Refusal{Refusal::kTooSmall, kMaxMessage, 0});
    auto op = std::make_unique<RecvOp>();
    op->bytes = h.bytes;
    op->buf = new char[h.bytes ? h.bytes : 1];
    RecvOp* raw = op.get();
    ops.push_back(std::move(op));
    conn.pull(h.msg_id, raw);
  }
  void on_send_done(SendOp*) override {}
  void on_send_refused(SendOp*, const Refusal&) override {}
  void on_recv_done(RecvOp*) override {}
  ~FuzzSink() override {
    for (auto& op : ops) delete[] static_cast<char*>(op->buf);
  }
  std::vector<std::unique_ptr<RecvOp>> ops;
};

int segment_fd() {
  static int fd = [] {
    int f = memfd_create("fuzz-shm", MFD_CLOEXEC);
    if (f < 0 || ftruncate(f, sizeof(Segment)) != 0) std::abort();
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  const bool cma = r.u(1) % 2;
  // The sender's view of the segment, cleared of the previous input's counters and headers.
  auto sender = std::make_unique<Mapping>(segment_fd());
  Segment* seg = sender->get();
  std::memset(static_cast<void*>(seg), 0, offsetof(Segment, chunks));
  for (auto& c : seg->chunks) c.seq.store(0);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  UniqueFd peer_end(sv[1]);
  Poller poller;
  FuzzSink sink;
  auto conn = std::make_unique<ShmRecvConn>(1, std::make_unique<ControlSocket>(UniqueFd(sv[0]), &poller, "fuzz shm"),
                                            std::make_unique<Mapping>(segment_fd()), &sink, getpid(), cma, true);
  uint64_t slots = 0, chunks = 0, posted = 1;
  try {
    while (r.n > 0) {
      const uint64_t what = r.u(1) % 4;
      if (what == 0 || what == 1) {  // a slot: eager or announcement (or an unknown kind)
        if (slots - seg->slots_consumed.load() >= kSlots) { conn->progress(true); continue; }
        Slot& s = seg->slots[slots % kSlots];
        static const uint32_t kinds[8] = {kEager, kRts, kRts, kEager, kRts, kRts, kEager, 0};
        s.kind = kinds[r.u(1) % 8];
        s.msg_id = r.u(1) % 2;
        s.bytes = edge(r, posted);
        s.addr = r.u(1) % 2 ? reinterpret_cast<uint64_t>(source().data()) : edge(r, 0);
        if (s.kind == kRts) posted = s.bytes;
        s.seq.store(++slots);
      } else if (what == 2) {  // a pipeline chunk
        if (chunks - seg->chunks_consumed.load() >= kChunks) { conn->progress(true); continue; }
        Chunk& c = seg->chunks[chunks % kChunks];
        c.msg_id = r.u(1) % 2;
        c.offset = edge(r, posted);
        c.len = edge(r, posted, c.offset);
        c.seq.store(++chunks);
      } else {  // a shared copy's handed-back chunk, and its progress
        Share& s = seg->shares[r.u(1) % kShares];
        s.returned.store(edge(r, 3));
        if (r.u(1) % 2) s.done.fetch_add(edge(r, posted));
      }
      conn->progress(r.u(1) % 2);
    }
    for (int i = 0; i < 16; ++i) conn->progress(true);
  } catch (const PeerError&) {
  }
  conn.reset();
  return 0;
}
