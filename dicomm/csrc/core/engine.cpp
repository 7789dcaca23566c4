#include "core/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sched.h>

#include "core/log.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/verbs/verbs_transport.h"

namespace dicomm {
namespace {

constexpr size_t kSelfEagerLimit = 64 * 1024;
constexpr size_t kRegisterAbove = 16 * 1024;  // smaller messages travel eagerly on every transport

std::string transport_setting(const std::string& option) {
  const char* env = std::getenv("DICOMM_TRANSPORT");
  std::string v = env && *env ? env : option;
  if (v != "auto" && v != "shm" && v != "tcp" && v != "verbs")
    throw ValueError("transport '" + v + "' is not known; expected auto, shm or tcp, or verbs on RDMA hosts" +
                     (env && *env ? " (from DICOMM_TRANSPORT)" : ""));
  return v;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::chrono::milliseconds handshake_timeout() {
  const char* v = std::getenv("DICOMM_HANDSHAKE_TIMEOUT_MS");
  return std::chrono::milliseconds(v && *v ? std::max(1L, std::atol(v)) : 5000L);
}

}  // namespace

Engine::Engine(std::shared_ptr<Store> store, int rank, int size, const Options& options)
    : rank_(rank), size_(size), timeout_(options.timeout), forced_(transport_setting(options.transport)),
      bootstrap_(std::move(store), rank, options.timeout), card_(Card::local()), cpus_(affinity_cpus()),
      poller_(std::make_unique<transport::Poller>()), peers_(static_cast<size_t>(size)) {
  transport::Context ctx;
  ctx.rank = rank;
  ctx.size = size;
  ctx.key = handshake_key(bootstrap_.agree_on_token(), job_secret());
  ctx.sink = this;
  ctx.poller = poller_.get();
  ctx.handshake_timeout = handshake_timeout();
  ctx.counters = &counters_;
  transports_["shm"] = std::make_unique<transport::shm::ShmTransport>(ctx);
  transports_["tcp"] = std::make_unique<transport::tcp::TcpTransport>(ctx);
  if (forced_ == "auto" || forced_ == "verbs") open_verbs(ctx);
  for (auto& [name, t] : transports_) card_.addresses[name] = t->address();
  bootstrap_.publish(card_);
  for (const char* c : {"rejected_connections", "connections_accepted", "connections_opened", "messages_sent",
                        "messages_received", "bytes_sent", "bytes_received", "unexpected_messages", "peers_lost",
                        "shm_bytes_written_by_sender", "shm_cma_unavailable", "waits_unspun"})
    counters_[c] = 0;
  hot_ = {&counters_["messages_sent"], &counters_["messages_received"], &counters_["bytes_sent"],
          &counters_["bytes_received"], &counters_["unexpected_messages"], &counters_["waits_unspun"]};
}

Engine::~Engine() { close(); }

// No silent fallback: a host without RDMA says so once per process (an error when verbs is forced).
void Engine::open_verbs(const transport::Context& ctx) {
  if (auto t = transport::verbs::VerbsTransport::create(ctx, &verbs_why_)) {
    transports_["verbs"] = std::move(t);
    return;
  }
  if (forced_ == "verbs")
    throw Error("DICOMM_TRANSPORT/transport=verbs, but rank " + std::to_string(rank_) +
                " has no usable RDMA device: " + verbs_why_);
  static std::once_flag logged;
  std::call_once(logged, [&] {
    log(LogLevel::kInfo, "rank " + std::to_string(rank_) + ": no RDMA verbs transport (" + verbs_why_ +
                             "); peers on other hosts use tcp");
  });
}

void Engine::start() {
  progress_thread_ = std::thread([this] { progress_loop(); });
  const char* mode = std::getenv("DICOMM_CONNECT");
  std::string m = mode && *mode ? mode : "eager";
  if (m != "eager" && m != "lazy") throw ValueError("DICOMM_CONNECT='" + m + "' is not known; expected eager or lazy");
  if (m == "eager" && size_ > 1) connector_thread_ = std::thread([this] { connect_all(); });
}

// ---------------------------------------------------------------- requests

Engine::RequestSP Engine::failed_request(P2PRequest::Op op, int peer, Tag tag, uint64_t meta, void* buf,
                                         size_t bytes, ErrorKind kind, const std::string& why) {
  auto r = std::make_shared<P2PRequest>(shared_from_this(), op, peer, tag, meta, buf, bytes);
  r->fail(kind, r->describe() + " failed: " + why);
  return r;
}

RequestPtr Engine::isend(const void* buf, size_t bytes, int peer, Tag tag, uint64_t meta) {
  if (peer < 0 || peer >= size_)
    throw ValueError("isend: peer " + std::to_string(peer) + " is not a rank of this communicator (ranks 0.." +
                     std::to_string(size_ - 1) + ")");
  if (!buf && bytes) throw ValueError("isend: null buffer with " + std::to_string(bytes) + " bytes");
  auto r = std::make_shared<P2PRequest>(shared_from_this(), P2PRequest::Op::kSend, peer, tag, meta,
                                        const_cast<void*>(buf), bytes);
  r->send_op.hdr = transport::Header{tag, meta, bytes, 0};
  r->send_op.buf = buf;
  if (peer == rank_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) fail(*r, kind_for_locked(*r), r->describe() + " failed: " + abort_reason_);
    else send_to_self(r);
    return r;
  }
  transport::SendConn* conn = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);  // fast path: connected already
    Peer& p = peers_[peer];
    if (p.send && !closed_) {
      post_locked(r, *p.send, peer);
      return r;
    }
  }
  try {
    conn = connection_to(peer);
  } catch (const PeerError& e) {
    std::lock_guard<std::mutex> lock(mu_);
    peer_lost(peer, e.what());
    graveyard_.clear();
  }
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = peers_[peer];
  if (closed_) fail(*r, kind_for_locked(*r), r->describe() + " failed: " + abort_reason_);
  else if (p.dead || !conn || p.send.get() != conn)
    fail(*r, ErrorKind::kPeer, r->describe() + " failed: rank " + std::to_string(peer) + " is gone: " + p.dead_reason);
  else post_locked(r, *conn, peer);
  return r;
}

void Engine::post_locked(const RequestSP& r, transport::SendConn& conn, int peer) {
  const size_t bytes = r->capacity;
  if (numbered(r->tag)) r->send_op.hdr.tag_seq = sent_seq_[{peer, r->tag}]++;
  if (bytes > kRegisterAbove) r->send_op.mem = transports_[peers_[peer].transport]->register_memory(r->buf, bytes);
  posting_ = &r;
  struct Clear { const RequestSP*& p; ~Clear() { p = nullptr; } } clear{posting_};  // however post() ends
  try {
    conn.post(&r->send_op);  // may complete at once (eager): take_in_flight then clears posting_
  } catch (const PeerError& e) {
    if (posting_) in_flight_[&r->send_op] = r;  // not complete: peer_lost fails what is in flight
    posting_ = nullptr;
    peer_lost(peer, e.what());
    graveyard_.clear();
    return;
  }
  if (posting_) in_flight_[&r->send_op] = r;  // not complete inside post(): in flight
}

RequestPtr Engine::irecv(void* buf, size_t bytes, int peer, Tag tag, uint64_t meta) {
  if (peer != kAnySource && (peer < 0 || peer >= size_))
    throw ValueError("irecv: peer " + std::to_string(peer) + " is not a rank of this communicator (ranks 0.." +
                     std::to_string(size_ - 1) + ", or -1 for any source)");
  if (!buf && bytes) throw ValueError("irecv: null buffer with " + std::to_string(bytes) + " bytes");
  auto r = std::make_shared<P2PRequest>(shared_from_this(), P2PRequest::Op::kRecv, peer, tag, meta, buf, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) {
    fail(*r, kind_for_locked(*r), r->describe() + " failed: " + abort_reason_);
    return r;
  }
  if (auto msg = queues_.take_unexpected(peer, tag)) {
    int src = msg->src;
    try {
      match(r, std::move(*msg));  // a rendezvous answers the sender: that may find it gone
    } catch (const PeerError& e) {
      peer_lost(src, e.what());
      graveyard_.clear();
    }
  } else if (peer != kAnySource && peers_[peer].dead) {
    fail(*r, ErrorKind::kPeer, r->describe() + " failed: rank " + std::to_string(peer) + " is gone: " + peers_[peer].dead_reason);
  } else if (peer == kAnySource && size_ > 1 && std::all_of(peers_.begin(), peers_.end(), [&](const Peer& p) {
               return &p == &peers_[rank_] || p.dead;
             })) {
    fail(*r, ErrorKind::kPeer, r->describe() + " failed: every other rank is gone");
  } else {
    queues_.post(r);
  }
  return r;
}

void Engine::send_to_self(const RequestSP& r) {
  const size_t bytes = r->capacity;
  transport::Header h{r->tag, r->meta, bytes, 0};
  if (auto recv = queues_.take_posted(rank_, r->tag)) {
    Unexpected msg;
    msg.src = rank_;
    msg.hdr = h;
    msg.self_send = r;
    match(recv, std::move(msg));
    return;
  }
  Unexpected msg;
  msg.src = rank_;
  msg.hdr = h;
  if (bytes <= kSelfEagerLimit) {  // buffered: the send completes now, as an eager send would
    msg.data.assign(static_cast<const char*>(r->send_op.buf), static_cast<const char*>(r->send_op.buf) + bytes);
    finish(*r, rank_, bytes);
  } else {
    msg.self_send = r;  // completes when a receive takes it
  }
  queues_.add_unexpected(std::move(msg));
}

// ---------------------------------------------------------------- queries

std::string Engine::transport_of(int peer) const {
  if (peer < 0 || peer >= size_)
    throw ValueError("transport_of: peer " + std::to_string(peer) + " is not a rank of this communicator (ranks 0.." +
                     std::to_string(size_ - 1) + ")");
  if (peer == rank_) return "self";
  std::lock_guard<std::mutex> lock(mu_);
  return path_of_locked(peers_[peer]);
}

std::map<std::string, int64_t> Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto out = counters_;
  out["unexpected_queued"] = static_cast<int64_t>(queues_.unexpected_count());
  out["in_flight"] = static_cast<int64_t>(in_flight_.size());
  out["local_ranks_known"] = local_ranks_;
  out["spin_yield_every"] = spin_yield_every_locked();
  auto verbs = transports_.find("verbs");
  if (verbs != transports_.end()) {  // the registration cache is touched under the engine lock too
    auto& cache = static_cast<transport::verbs::VerbsTransport&>(*verbs->second).nic().cache();
    out["verbs_reg_cache_hits"] = static_cast<int64_t>(cache.hits());
    out["verbs_reg_cache_misses"] = static_cast<int64_t>(cache.misses());
    out["verbs_reg_cache_stale"] = static_cast<int64_t>(cache.stale());
    out["verbs_peers"] = out["verbs_device_direct_peers"] = out["verbs_cpu_mediated_peers"] = 0;
    for (const auto& p : peers_) {
      std::string path = path_of_locked(p);
      if (path.rfind("verbs", 0) == 0) ++out["verbs_peers"];
      if (path.find("device-direct") != std::string::npos) ++out["verbs_device_direct_peers"];
      if (path.find("cpu-mediated") != std::string::npos) ++out["verbs_cpu_mediated_peers"];
    }
  }
  return out;
}

}  // namespace dicomm
