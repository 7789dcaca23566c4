// Two processes (fork) talking through dicomm's verbs transport directly, with a minimal sink in
// place of the engine: checks every size byte for byte, then measures ping-pong latency and
// streaming bandwidth. Prints one JSON line; exit 0 only if every check passed.
//   verbs_pingpong probe              -> the device/port/GID probe as JSON
//   verbs_pingpong run [iters]        -> checks + numbers
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "transport/poller.h"
#include "transport/verbs/accel.h"
#include "transport/verbs/device.h"
#include "transport/verbs/verbs_transport.h"

using namespace dicomm;
using namespace dicomm::transport;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(int rank, const std::string& why) {
  std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
  std::fflush(stderr);
  _exit(1);
}

// Stands in for the engine: messages are delivered into `target` one at a time, in order, when
// the test asks for the next one (arrivals before that wait, as unexpected messages would).
struct MiniSink : Sink {
  std::shared_ptr<RecvConn> recv;
  char* target = nullptr;
  size_t received = 0, sent = 0, refused = 0, wanted = 0;
  RecvOp op;
  struct Arrival { RecvConn* conn; Header h; std::vector<char> eager; bool rendezvous; };
  std::deque<Arrival> arrivals;
  void on_accept(std::shared_ptr<RecvConn> c) override { recv = std::move(c); }
  void on_rejected(const std::string& why) override { std::fprintf(stderr, "rejected: %s\n", why.c_str()); }
  void on_message(RecvConn& c, const Header& h, const void* payload) override {
    Arrival a{&c, h, {}, payload == nullptr};
    if (payload) a.eager.assign(static_cast<const char*>(payload), static_cast<const char*>(payload) + h.bytes);
    arrivals.push_back(std::move(a));
    deliver();
  }
  void deliver() {
    while (wanted > 0 && !arrivals.empty()) {
      Arrival a = std::move(arrivals.front());
      arrivals.pop_front();
      --wanted;
      if (!a.rendezvous) {
        if (a.h.bytes) std::memcpy(target, a.eager.data(), a.h.bytes);
        ++received;
      } else {
        op.buf = target;
        op.bytes = a.h.bytes;
        a.conn->pull(a.h.msg_id, &op);
      }
    }
  }
  void on_send_done(SendOp*) override { ++sent; }
  void on_send_refused(SendOp*, const Refusal&) override { ++refused; }
  void on_recv_done(RecvOp*) override { ++received; }
};

template <typename B>
void fill(B& b, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xFF);
}

struct Rank {
  int rank;
  MiniSink sink;
  Poller poller;
  std::unique_ptr<verbs::VerbsTransport> t;
  std::unique_ptr<SendConn> send;

  int passes = 0;
  void pump(Clock::time_point deadline, const char* what) {
    try {
      bool thorough = ++passes % 64 == 0;  // sockets and async events: rarely (syscalls are dear)
      if (send) send->progress(thorough);
      if (sink.recv) sink.recv->progress(thorough);
      if (thorough) t->progress();
    } catch (const std::exception& e) {
      die(rank, std::string(what) + ": " + e.what());
    }
    if (Clock::now() > deadline) die(rank, std::string("timed out: ") + what);
  }
  void send_msg(const char* buf, size_t n, uint64_t tag) {
    static std::vector<SendOp> ops(4096);
    SendOp& op = ops[tag % ops.size()];
    op = SendOp{};
    op.hdr.tag = tag;
    op.hdr.bytes = n;
    op.buf = buf;
    send->post(&op);
  }
  void wait_sent(size_t count) {
    auto dl = Clock::now() + std::chrono::seconds(60);
    while (sink.sent < count) pump(dl, "send completion");
  }
  void wait_received(size_t count) {  // asks for the messages up to `count`, then waits
    auto dl = Clock::now() + std::chrono::seconds(60);
    sink.wanted = count - sink.received;
    sink.deliver();
    while (sink.received < count) pump(dl, "receive");
  }
};

int run_rank(int rank, int sock, int iters) {
  Rank r;
  r.rank = rank;
  Context ctx;
  ctx.rank = rank;
  ctx.size = 2;
  ctx.token.fill(7);
  ctx.sink = &r.sink;
  ctx.poller = &r.poller;
  std::string why;
  r.t = verbs::VerbsTransport::create(ctx, &why);
  if (!r.t) die(rank, "no verbs: " + why);
  std::string mine = r.t->address();
  char peer_addr[256] = {};
  if (write(sock, mine.c_str(), mine.size() + 1) < 0 || read(sock, peer_addr, sizeof(peer_addr) - 1) <= 0)
    die(rank, "address exchange failed");
  Card card;
  card.addresses["verbs"] = peer_addr;
  std::string err;
  std::thread connector([&] {
    try {
      r.send = r.t->connect(1 - rank, card, Clock::now() + std::chrono::seconds(30));
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  auto dl = Clock::now() + std::chrono::seconds(30);
  while (!r.sink.recv) {
    r.t->progress();
    if (Clock::now() > dl) die(rank, "no incoming connection");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  connector.join();
  if (!r.send) die(rank, "connect: " + err);

  // 1. Every size, both directions, verified.
  std::vector<size_t> sizes = {0, 1, 8, 4095, 8192, 8193, 65536, 65537, 1 << 20, (3 << 20) + 7, 16 << 20};
  std::vector<char> out_v(16 << 20), in_v(16 << 20), want(16 << 20);
  // VERBS_PINGPONG_ALIGN=1: page-aligned buffers (diagnoses providers that mishandle offsets).
  static const bool align = std::getenv("VERBS_PINGPONG_ALIGN") != nullptr;
  char* out_p = align ? static_cast<char*>(std::aligned_alloc(4096, 16 << 20)) : out_v.data();
  char* in_p = align ? static_cast<char*>(std::aligned_alloc(4096, 16 << 20)) : in_v.data();
  struct View { char* p; char* data() { return p; } char& operator[](size_t i) { return p[i]; } };
  View out{out_p}, in{in_p};
  uint64_t tag = 0;
  for (size_t n : sizes) {
    for (int dir = 0; dir < 2; ++dir) {
      ++tag;
      if (rank == dir) {
        fill(out, n, static_cast<unsigned>(tag));
        size_t before = r.sink.sent;  // an eager send completes inside post()
        r.send_msg(out.data(), n, tag);
        r.wait_sent(before + 1);
      } else {
        std::memset(in.data(), 0xEE, n);
        r.sink.target = in.data();
        r.wait_received(r.sink.received + 1);
        fill(want, n, static_cast<unsigned>(tag));
        if (std::memcmp(in.data(), want.data(), n) != 0) {
          size_t first = 0, bad = 0;
          for (size_t i = n; i-- > 0;)
            if (in[i] != want[i]) { first = i; ++bad; }
          die(rank, "data mismatch in a " + std::to_string(n) + " B message: " + std::to_string(bad) +
                        " bytes differ, the first at offset " + std::to_string(first) + " (got " +
                        std::to_string(static_cast<unsigned char>(in[first])) + ", want " +
                        std::to_string(static_cast<unsigned char>(want[first])) + ")");
        }
      }
    }
  }
  // 2. Ping-pong latency (8 B) and streaming bandwidth (64 KiB, 1 MiB).
  auto pingpong = [&](size_t n, int count) {
    r.sink.target = in.data();
    auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) {
      if (rank == 0) {
        r.send_msg(out.data(), n, ++tag);
        r.wait_received(r.sink.received + 1);
      } else {
        r.wait_received(r.sink.received + 1);
        r.send_msg(out.data(), n, ++tag);
      }
    }
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / count / 2;
  };
  auto stream = [&](size_t n, int count) {
    r.sink.target = in.data();
    size_t base_s = r.sink.sent, base_r = r.sink.received;
    auto t0 = Clock::now();
    if (rank == 0) {
      for (int i = 0; i < count; ++i) r.send_msg(out.data(), n, ++tag);
      r.wait_sent(base_s + static_cast<size_t>(count));
      r.wait_received(base_r + 1);  // the receiver's acknowledgement
    } else {
      r.wait_received(base_r + static_cast<size_t>(count));
      r.send_msg(out.data(), 1, ++tag);
      r.wait_sent(base_s + 1);  // base_s was taken before the post
    }
    return static_cast<double>(n) * count / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6;
  };
  pingpong(8, 50);  // warm-up
  double lat8 = pingpong(8, iters);
  double bw64k = stream(65536, 200);
  double bw1m = stream(1 << 20, 32);
  if (rank == 0)
    std::printf("{\"ok\": true, \"lat_8B_us\": %.2f, \"bw_64KiB_MBps\": %.1f, \"bw_1MiB_MBps\": %.1f, \"address\": \"%s\", "
                "\"reg_cache_hits\": %zu, \"reg_cache_misses\": %zu}\n",
                lat8, bw64k, bw1m, mine.c_str(), r.t->nic().cache().hits(), r.t->nic().cache().misses());
  std::fflush(stdout);
  // Both ranks finished their last waits: close in order.
  char b = 0;
  if (write(sock, &b, 1) < 0 || read(sock, &b, 1) < 0) {}
  r.send.reset();
  r.sink.recv.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "run";
  if (mode == "probe") {
    std::string why;
    verbs::decide_path(verbs::Accel::get().caps(), &why);
    std::printf("{\"probe\": %s, \"device_path_without_gpu\": \"%s\"}\n", verbs::probe_json().c_str(), why.c_str());
    return 0;
  }
  int iters = argc > 2 ? std::atoi(argv[2]) : 1000;
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t child = fork();
  // VERBS_PINGPONG_SWAP=1: the child is rank 0 (diagnoses fork-related registration issues).
  const bool swap = std::getenv("VERBS_PINGPONG_SWAP") != nullptr;
  if (child == 0) _exit(run_rank(swap ? 0 : 1, sv[1], iters));
  int rc = run_rank(swap ? 1 : 0, sv[0], iters);
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ? 1 : 0;
}
