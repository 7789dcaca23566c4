// Two processes (fork) talking through dicomm's verbs transport directly, with a minimal sink in
// place of the engine: checks every size byte for byte, then measures ping-pong latency and
// streaming bandwidth. Prints one JSON line; exit 0 only if every check passed.
//   verbs_pingpong probe              -> the device/port/GID probe as JSON
//   verbs_pingpong run [iters]        -> checks + numbers
//   verbs_pingpong write-target N DIR -> a buffer of N bytes registered through dicomm's cache and
//       dicomm's RC queue pair, published in DIR/target.json for an independent peer (pyverbs) to
//       RDMA-WRITE into; once DIR/written appears, the bytes are checked against the peer's pattern
//   verbs_pingpong exchange DIR SIZES -> rank 0 of 2 facing an independent implementation of the wire
//       protocol (tests/rdma/pyverbs_peer.py) as rank 1: address and job token in DIR/dicomm.json,
//       the peer's address from DIR/peer.json; for each of SIZES (comma-separated) one message each
//       way, byte for byte; then, until DIR/done appears, it keeps accepting (the peer tries a
//       wrong wire version)
//   verbs_pingpong channel-limits CGROUP -> Channel constructors made to fail part-way by the kernel's
//       rdma cgroup limit on the device's objects (this process moves into CGROUP, a cgroup2 folder
//       with the rdma controller): per limit, where it failed, and the device objects and open
//       descriptors left afterwards against before (the kernel's count, rdma.current)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/communicator.h"
#include "core/config.h"
#include "core/handshake.h"
#include "transport/poller.h"
#include "transport/verbs/accel.h"
#include "transport/verbs/channel.h"
#include "transport/verbs/device.h"
#include "transport/verbs/nic.h"
#include "transport/verbs/verbs_transport.h"

using namespace dicomm;
using namespace dicomm::transport;
using Clock = std::chrono::steady_clock;

namespace {

// The settings as an engine would read them: the table's defaults under the environment.
const EngineConfig& settings() {
  static const EngineConfig c = EngineConfig::load(Options{});
  return c;
}

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
  Header last;  // of the message delivered last
  struct Arrival { RecvConn* conn; Header h; std::vector<char> eager; bool rendezvous; };
  std::deque<Arrival> arrivals;
  void on_accept(std::shared_ptr<RecvConn> c) override { recv = std::move(c); }
  std::vector<std::string> rejected;
  void on_rejected(const std::string& why) override {
    std::fprintf(stderr, "rejected: %s\n", why.c_str());
    rejected.push_back(why);
  }
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
      last = a.h;
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
  void send_msg(const char* buf, size_t n, uint64_t tag, uint64_t meta = 0) {
    static std::vector<SendOp> ops(4096);
    SendOp& op = ops[tag % ops.size()];
    op = SendOp{};
    op.hdr.tag = tag;
    op.hdr.meta = meta;
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
  ctx.config = &settings();
  ctx.rank = rank;
  ctx.size = 2;
  ctx.key = std::string(32, '\x07');  // both ranks agree on the handshake key
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
  // VERBS_PINGPONG_LAT_ONLY=1: only the 8 B ping-pong, and the medians of its phases on stderr (how long
  // posting a send takes, how long the wait for the reply after it, and the polls in that wait)
  static const bool lat_only = std::getenv("VERBS_PINGPONG_LAT_ONLY") != nullptr;
  if (lat_only) sizes.clear();
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
  std::vector<double> post_us, wait_us, passes;
  std::vector<double> halves;  // per round trip, for the median (the host's load makes the mean swing)
  auto pingpong = [&](size_t n, int count) {
    r.sink.target = in.data();
    halves.clear();
    auto t0 = Clock::now();
    post_us.clear(); wait_us.clear(); passes.clear();
    for (int i = 0; i < count; ++i) {
      auto ti = Clock::now();
      auto us_since = [](Clock::time_point a) { return std::chrono::duration<double, std::micro>(Clock::now() - a).count(); };
      auto timed_send = [&] {
        auto a = lat_only ? Clock::now() : Clock::time_point{};
        r.send_msg(out.data(), n, ++tag);
        if (lat_only) post_us.push_back(us_since(a));
      };
      auto timed_wait = [&] {
        int p0 = r.passes;
        auto a = lat_only ? Clock::now() : Clock::time_point{};
        r.wait_received(r.sink.received + 1);
        if (lat_only) wait_us.push_back(us_since(a)), passes.push_back(r.passes - p0);
      };
      if (rank == 0) {
        timed_send();
        timed_wait();
      } else {
        timed_wait();
        timed_send();
      }
      halves.push_back(std::chrono::duration<double, std::micro>(Clock::now() - ti).count() / 2);
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
    // MiB/s: perftest's "MB/sec" is 2^20 bytes per second.
    return static_cast<double>(n) * count / std::chrono::duration<double>(Clock::now() - t0).count() / (1 << 20);
  };
  pingpong(8, 50);  // warm-up
  double lat8 = pingpong(8, iters);
  if (lat_only) {
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v.empty() ? 0.0 : v[v.size() / 2]; };
    std::vector<double> per_pass;
    for (size_t i = 0; i < wait_us.size(); ++i) if (passes[i] > 0) per_pass.push_back(wait_us[i] / passes[i]);
    std::fprintf(stderr, "rank %d: post %.2f us, wait %.2f us, passes %.0f, per pass %.3f us (medians)\n", rank,
                 med(post_us), med(wait_us), med(passes), med(per_pass));
  }
  std::sort(halves.begin(), halves.end());
  const double lat8_median = halves.empty() ? 0 : halves[halves.size() / 2];
  double bw64k = lat_only ? 0.0 : stream(65536, 200);
  double bw1m = lat_only ? 0.0 : stream(1 << 20, 32);
  if (rank == 0)
    std::printf("{\"ok\": true, \"lat_8B_us\": %.2f, \"lat_8B_mean_us\": %.2f, \"bw_64KiB_MiBps\": %.1f, "
                "\"bw_1MiB_MiBps\": %.1f, \"address\": \"%s\", \"reg_cache_hits\": %zu, \"reg_cache_misses\": %zu}\n",
                lat8_median, lat8, bw64k, bw1m, mine.c_str(), r.t->nic().cache().hits(), r.t->nic().cache().misses());
  std::fflush(stdout);
  // Both ranks finished their last waits: close in order.
  char b = 0;
  if (write(sock, &b, 1) < 0 || read(sock, &b, 1) < 0) {}
  r.send.reset();
  r.sink.recv.reset();
  return 0;
}

// The pattern the independent peer writes (tests/rdma/guest_pyverbs.py computes it on its own).
unsigned char peer_byte(size_t i) { return static_cast<unsigned char>((i * 7 + 13 + (i >> 8)) & 0xFF); }

bool wait_file(const std::string& path, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    if (access(path.c_str(), F_OK) == 0) return true;
    usleep(50000);
  }
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint64_t json_u64(const std::string& j, const std::string& key) {  // flat JSON with integer values
  auto at = j.find("\"" + key + "\"");
  if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + j);
  return std::stoull(j.substr(j.find(':', at) + 1));
}

// The first active port, opened as the transport opens it (throws when there is none).
std::shared_ptr<dicomm::transport::verbs::Nic> open_first_port() {
  using namespace dicomm::transport::verbs;
    std::string why;
    const IbvApi* api = ibv_api(&why);
    if (!api) throw std::runtime_error(why);
    auto devices = discover(*api, &why);
    auto ports = usable_ports(devices, settings().ib_hca);
    if (ports.empty()) throw std::runtime_error("no active port: " + why);
    int max_wr = 0, max_rd = 0;
    for (const auto& d : devices)
      if (d.name == ports[0].device) { max_wr = d.max_qp_wr; max_rd = d.max_qp_rd_atom; }
  return std::make_shared<Nic>(*api, ports[0], max_wr, max_rd, settings());
}

int write_target(size_t n, const std::string& dir) {
  using namespace dicomm::transport::verbs;
  try {
    auto nic = open_first_port();
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);  // the channel's side channel: unused here
    int gid = choose_gid(nic->port(), "", settings().ib_gid_index, nullptr);
    Channel ch(nic, UniqueFd(sv[0]), gid, "write target", nullptr, settings());
    std::vector<char> buf(n, static_cast<char>(0xEE));
    Registration* reg = nic->cache().acquire(buf.data(), n);
    if (!reg->mr) throw std::runtime_error("the buffer could not be registered");
    WireInfo mine = ch.local_info();
    std::string gidhex;
    for (uint8_t b : mine.gid) { char h[3]; std::snprintf(h, 3, "%02x", b); gidhex += h; }
    std::ofstream(dir + "/target.json.tmp") << "{\"qpn\": " << mine.qpn << ", \"psn\": " << mine.psn << ", \"mtu\": " << mine.mtu
        << ", \"gid_index\": " << gid << ", \"addr\": " << reinterpret_cast<uintptr_t>(buf.data()) << ", \"rkey\": "
        << reg->rkey() << ", \"bytes\": " << n << ", \"gid\": \"" << gidhex << "\"}\n";
    std::rename((dir + "/target.json.tmp").c_str(), (dir + "/target.json").c_str());
    if (!wait_file(dir + "/peer.json", 60)) throw std::runtime_error("the peer published no peer.json in 60 s");
    std::string pj = read_text(dir + "/peer.json");
    WireInfo peer;
    peer.qpn = static_cast<uint32_t>(json_u64(pj, "qpn"));
    peer.psn = static_cast<uint32_t>(json_u64(pj, "psn"));
    peer.mtu = static_cast<uint32_t>(json_u64(pj, "mtu"));
    peer.slots = 1;
    peer.rd_atom = 1;
    peer.eager_bytes = mine.eager_bytes;  // the writer sends no messages: any size it would accept
    auto at = pj.find("\"gid\"");
    std::string g = pj.substr(pj.find('"', pj.find(':', at)) + 1, 32);
    for (int i = 0; i < 16; ++i) peer.gid[i] = static_cast<uint8_t>(std::stoul(g.substr(2 * i, 2), nullptr, 16));
    ch.connect(peer);
    std::ofstream(dir + "/ready") << "1\n";
    if (!wait_file(dir + "/written", 60)) throw std::runtime_error("the peer did not report its write in 60 s");
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; ++i)
      if (static_cast<unsigned char>(buf[i]) != peer_byte(i)) { ++bad; if (first == n) first = i; }
    const uint32_t rkey = reg->rkey();
    nic->cache().release(reg);
    std::printf("{\"ok\": %s, \"bytes\": %zu, \"mismatched\": %zu, \"first_mismatch\": %zu, \"rkey\": %u}\n",
                bad ? "false" : "true", n, bad, first, rkey);
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::printf("{\"ok\": false, \"error\": \"%s\"}\n", e.what());
    return 1;
  }
}

// The exchange's rule, written independently in tests/rdma/guest_pyverbs.py: message `seed`'s byte j,
// and its meta.
unsigned char exchange_byte(size_t j, uint64_t seed) { return static_cast<unsigned char>(((j + seed) % 251 * 7 + 13) & 0xFF); }
uint64_t exchange_meta(size_t n) { return (static_cast<uint64_t>(n) << 8) | 0x5A; }

std::string json_text(const std::string& j, const std::string& key) {  // flat JSON, string value without escapes
  auto at = j.find("\"" + key + "\"");
  if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + j);
  auto open = j.find('"', j.find(':', at) + 1);
  return j.substr(open + 1, j.find('"', open + 1) - open - 1);
}

int exchange(const std::string& dir, const std::string& size_list) {
  std::vector<size_t> sizes;
  for (std::stringstream ss(size_list); ss.good();) {
    std::string item;
    std::getline(ss, item, ',');
    sizes.push_back(std::stoull(item));
  }
  Rank r;
  r.rank = 0;
  Context ctx;
  ctx.config = &settings();
  ctx.rank = 0;
  ctx.size = 2;
  const Token token = random_token();
  ctx.key = handshake_key(token, "");
  ctx.sink = &r.sink;
  ctx.poller = &r.poller;
  std::string why;
  r.t = verbs::VerbsTransport::create(ctx, &why);
  if (!r.t) die(0, "no verbs: " + why);
  std::ofstream(dir + "/dicomm.json.tmp") << "{\"address\": \"" << r.t->address() << "\", \"token\": \"" << token_hex(token)
                                          << "\"}\n";
  std::rename((dir + "/dicomm.json.tmp").c_str(), (dir + "/dicomm.json").c_str());
  if (!wait_file(dir + "/peer.json", 60)) die(0, "the peer published no peer.json in 60 s");
  Card card;
  card.addresses["verbs"] = json_text(read_text(dir + "/peer.json"), "address");
  std::string err;
  std::thread connector([&] {
    try {
      r.send = r.t->connect(1, card, Clock::now() + std::chrono::seconds(60));
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  auto dl = Clock::now() + std::chrono::seconds(60);
  while (!r.sink.recv && Clock::now() < dl) {
    r.t->progress();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  connector.join();
  if (!r.send || !r.sink.recv) die(0, "connections: " + (err.empty() ? "no incoming connection" : err));
  const size_t most = sizes.empty() ? 1 : std::max<size_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  std::vector<char> out(most), in(most);
  std::string results;
  bool all_ok = true;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t n = sizes[i];
    const uint64_t to_peer = 2 * i, from_peer = 2 * i + 1;  // tags, and the seeds of the bytes
    for (size_t j = 0; j < n; ++j) out[j] = static_cast<char>(exchange_byte(j, to_peer));
    const size_t before = r.sink.sent;
    r.send_msg(out.data(), n, to_peer, exchange_meta(n));
    r.wait_sent(before + 1);  // a rendezvous send completes on the peer's kFin
    std::memset(in.data(), 0xEE, n);
    r.sink.target = in.data();
    r.wait_received(r.sink.received + 1);
    size_t bad = 0;
    for (size_t j = 0; j < n; ++j) bad += static_cast<unsigned char>(in[j]) != exchange_byte(j, from_peer);
    const Header& h = r.sink.last;
    const bool ok = bad == 0 && h.tag == from_peer && h.meta == exchange_meta(n) && h.bytes == n;
    all_ok &= ok;
    results += std::string(results.empty() ? "" : ", ") + "{\"bytes\": " + std::to_string(n) + ", \"ok\": " +
               (ok ? "true" : "false") + ", \"mismatched\": " + std::to_string(bad) + ", \"tag\": " +
               std::to_string(h.tag) + ", \"meta_ok\": " + (h.meta == exchange_meta(n) ? "true" : "false") + "}";
  }
  dl = Clock::now() + std::chrono::seconds(60);
  while (access((dir + "/done").c_str(), F_OK) != 0 && Clock::now() < dl) {
    r.t->progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string rejected;
  for (const auto& why : r.sink.rejected) {
    rejected += std::string(rejected.empty() ? "\"" : ", \"");
    for (char c : why) rejected += c == '"' || c == '\\' ? ' ' : c;
    rejected += "\"";
  }
  std::printf("{\"ok\": %s, \"received\": [%s], \"reg_cache_misses\": %zu, \"rejected\": [%s]}\n",
              all_ok ? "true" : "false", results.c_str(), r.t->nic().cache().misses(), rejected.c_str());
  std::fflush(stdout);
  r.send.reset();
  r.sink.recv.reset();
  return all_ok ? 0 : 1;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write '" + text + "' to " + path);
}

long open_fds() {
  long n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.path().filename() != "." ? 1 : 0;
  return n;
}

// The kernel's count of this cgroup's objects on `device` (PDs, MRs, CQs, QPs...): rdma.current.
long device_objects(const std::string& cgroup, const std::string& device) {
  std::istringstream in(read_text(cgroup + "/rdma.current"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(device + " ", 0) != 0) continue;
    auto at = line.find("hca_object=");
    if (at != std::string::npos) return std::stol(line.substr(at + 11));
  }
  return 0;  // no objects charged yet: the device is not listed
}

int channel_limits(const std::string& cgroup) {
  using namespace dicomm::transport::verbs;
  try {
    write_file(cgroup + "/cgroup.procs", std::to_string(getpid()));
    auto nic = open_first_port();
    const std::string dev = nic->port().device;
    const int gid = choose_gid(nic->port(), "", settings().ib_gid_index, nullptr);
    const long base_objects = device_objects(cgroup, dev), base_fds = open_fds();
    std::string rows;
    bool made = false;
    for (long extra = 0; extra < 8 && !made; ++extra) {
      write_file(cgroup + "/rdma.max", dev + " hca_object=" + std::to_string(base_objects + extra));
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw std::runtime_error("socketpair");
      std::string failed;
      long during = -1;
      try {
        Channel ch(nic, UniqueFd(sv[0]), gid, "channel under limit", nullptr, settings());  // takes sv[0]
        during = device_objects(cgroup, dev) - base_objects;
        made = true;
      } catch (const std::exception& e) {
        failed = e.what();
      }
      close(sv[1]);
      std::string quoted;
      for (char c : failed) quoted += c == '"' || c == '\\' ? ' ' : c;
      rows += std::string(rows.empty() ? "" : ", ") + "{\"limit\": " + std::to_string(extra) + ", \"made\": " +
              (made ? "true" : "false") + ", \"objects_while_made\": " + std::to_string(during) +
              ", \"error\": \"" + quoted + "\", \"objects_left\": " +
              std::to_string(device_objects(cgroup, dev) - base_objects) + ", \"fds_left\": " +
              std::to_string(open_fds() - base_fds) + "}";
    }
    write_file(cgroup + "/rdma.max", dev + " hca_handle=max hca_object=max");
    std::printf("{\"ok\": true, \"device\": \"%s\", \"base_objects\": %ld, \"tries\": [%s]}\n", dev.c_str(), base_objects,
                rows.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::printf("{\"ok\": false, \"error\": \"%s\"}\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "run";
  if (mode == "probe") {
    std::string why;
    verbs::decide_path(verbs::Accel::get().caps(), &why);
    std::printf("{\"probe\": %s, \"device_path_without_gpu\": \"%s\"}\n", verbs::probe_json(settings()).c_str(), why.c_str());
    return 0;
  }
  if (mode == "write-target" && argc > 3) return write_target(std::strtoull(argv[2], nullptr, 10), argv[3]);
  if (mode == "exchange" && argc > 3) return exchange(argv[2], argv[3]);
  if (mode == "channel-limits" && argc > 2) return channel_limits(argv[2]);
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
