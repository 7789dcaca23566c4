// Fuzz target: a tcp receive connection's frame parser (transport/tcp), fed through a real socket.
// The input is decoded into frames whose lengths, offsets and ids come from a table of edge values
// (0, 1, the posted size, 2^64 - k ...) or the raw bytes, so announcements, clear-to-send and data
// frames meet often. Every rendezvous is "received" into a heap buffer of exactly the announced
// size: AddressSanitizer reports any write outside it. A ProtocolError or EOF ends an input.
#include <cstring>
#include <memory>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include "fuzz_main.h"
#include "transport/socket.h"
#include "transport/tcp/tcp_conn.h"

using namespace dicomm;
using namespace dicomm::transport;

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
    case 4: return ~uint64_t{0} - r.u(1);          // 2^64 - k
    case 5: return (~uint64_t{0} - posted) + 1;    // wraps posted back to 0
    case 6: return posted / 2;
    case 7: return uint64_t{1} << (r.u(1) % 64);
    case 8: return (0 - other) + posted;      // other + this wraps to posted
    case 9: return (0 - other) + r.u(1) % (std::min<uint64_t>(posted, 1u << 20) + 1);
    default: return r.u(8);
  }
}

class FuzzSink : public transport::Sink {
 public:
  void on_accept(std::shared_ptr<RecvConn>) override {}
  void on_rejected(const std::string&) override {}
  void on_message(RecvConn& conn, const Header& h, const void* payload) override {
    if (payload) {  // eager: its bytes must be readable
      std::vector<char> copy(static_cast<const char*>(payload), static_cast<const char*>(payload) + h.bytes);
      return;
    }
    if (h.bytes > (1u << 20)) return conn.refuse(h.msg_id, Refusal{Refusal::kTooSmall, 1u << 20, 0});
    auto op = std::make_unique<RecvOp>();
    op->bytes = h.bytes;
    op->buf = new char[h.bytes ? h.bytes : 1];  // exactly the posted size: ASan guards both ends
    RecvOp* raw = op.get();
    ops.push_back(std::move(op));
    conn.pull(h.msg_id, raw);
  }
  void on_send_done(SendOp*) override {}
  void on_send_refused(SendOp*, const Refusal&) override {}
  void on_recv_done(RecvOp*) override { ++done; }
  ~FuzzSink() override {
    for (auto& op : ops) delete[] static_cast<char*>(op->buf);
  }
  std::vector<std::unique_ptr<RecvOp>> ops;
  int done = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  const int nstreams = 1 + static_cast<int>(r.u(1) % 2);
  // The wire bytes per stream.
  std::vector<std::string> wire(static_cast<size_t>(nstreams));
  uint64_t posted = 1 + r.u(1) % 64;
  while (r.n > 0) {
    tcp::Frame f;
    // Mostly kinds a receiver accepts (any other ends the input at once), ids that repeat.
    static const uint32_t kinds[16] = {1, 2, 2, 3, 3, 3, 3, 3, 2, 3, 1, 3, 2, 3, 4, 0};
    f.kind = kinds[r.u(1) % 16];
    f.msg_id = r.u(1) % 2;
    f.tag = r.u(1);
    f.offset = edge(r, posted);
    f.bytes = f.kind == tcp::kEager ? r.u(1) : edge(r, posted, f.offset);
    size_t s = static_cast<size_t>(r.u(1)) % static_cast<size_t>(nstreams);
    if (f.kind == tcp::kRts) posted = f.bytes;
    std::string& out = wire[s];
    out.append(reinterpret_cast<const char*>(&f), sizeof(f));
    // Eager and data frames carry what they claim, within reason (a longer claim waits for bytes
    // never sent).
    if (f.kind == tcp::kEager || f.kind == tcp::kData)
      out.append(static_cast<size_t>(std::min<uint64_t>(f.bytes, 4096)), static_cast<char>(r.u(1)));
  }
  Poller poller;
  FuzzSink sink;
  auto conn = std::make_unique<tcp::TcpRecvConn>(1, nstreams, &sink);
  std::vector<UniqueFd> writers;
  for (int i = 0; i < nstreams; ++i) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    writers.emplace_back(sv[1]);
    conn->attach(i, std::make_unique<tcp::TcpStream>(UniqueFd(sv[0]), &poller, "fuzz stream " + std::to_string(i)));
  }
  std::vector<size_t> sent(static_cast<size_t>(nstreams), 0);
  try {
    for (int round = 0; round < 10000; ++round) {
      bool wrote = false;
      for (int i = 0; i < nstreams; ++i) {
        auto& w = wire[static_cast<size_t>(i)];
        size_t& at = sent[static_cast<size_t>(i)];
        if (at < w.size()) {
          ssize_t k = ::send(writers[static_cast<size_t>(i)].get(), w.data() + at, w.size() - at, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (k > 0) { at += static_cast<size_t>(k); wrote = true; }
        } else if (writers[static_cast<size_t>(i)].get() >= 0) {
          writers[static_cast<size_t>(i)].reset();  // EOF once everything is out
          wrote = true;
        }
      }
      bool moved = conn->progress(true);
      if (!wrote && !moved) break;
    }
  } catch (const PeerError&) {
    // ProtocolError (a violation), ConnectionClosed (every stream ended): both end the input
  }
  conn.reset();  // before the buffers go (the sink's destructor)
  return 0;
}
