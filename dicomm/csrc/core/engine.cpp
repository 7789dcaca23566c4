#include "core/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sched.h>

#include "core/log.h"
#include "transport/registry.h"

namespace dicomm {
namespace {

constexpr size_t kSelfEagerLimit = 64 * 1024;

std::string transport_setting(const EngineConfig& config) {
  const std::string& v = config.transport;
  std::vector<std::string> always{"auto"};
  std::string optional;  // "expected auto, shm or tcp, or verbs where this host has it"
  for (const auto& f : transport::registered_transports()) {
    if (f.name == v) return v;
    if (f.optional) optional += ", or " + f.name + " where this host has it";
    else always.push_back(f.name);
  }
  std::string known;
  for (size_t i = 0; i < always.size(); ++i)
    known += (i == 0 ? "" : i + 1 == always.size() ? " or " : ", ") + always[i];
  if (v != "auto")
    throw ValueError("transport '" + v + "' is not known; expected " + known + optional +
                     (config.transport_from_env ? " (from DICOMM_TRANSPORT)" : ""));
  return v;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

Engine::Engine(std::shared_ptr<Store> store, int rank, int size, const Options& options)
    : rank_(rank), size_(size), timeout_(options.timeout), config_(EngineConfig::load(options)),
      forced_(transport_setting(config_)),
      bootstrap_(std::move(store), rank, size, options.timeout), card_(Card::local()), cpus_(affinity_cpus()),
      poller_(std::make_unique<transport::Poller>()), peers_(static_cast<size_t>(size)) {
  transport::Context ctx;
  ctx.rank = rank;
  ctx.size = size;
  bootstrap_.enter_round();
  ctx.key = handshake_key(bootstrap_.agree_on_token(), config_.job_secret);
  if (!config_.job_secret.empty()) bootstrap_.sign_cards_with(ctx.key);
  ctx.sink = this;
  ctx.poller = poller_.get();
  ctx.handshake_timeout = config_.handshake_timeout;
  ctx.config = &config_;
  open_transports(ctx);
  for (auto& t : transports_) card_.addresses[t->name()] = t->address();
  bootstrap_.publish(card_);
}

Engine::~Engine() { close(); }

void EngineCounters::add_to(std::map<std::string, int64_t>& out) const {
#define DICOMM_COUNTER_OUT(name) out[#name] = name;
  DICOMM_ENGINE_COUNTERS(DICOMM_COUNTER_OUT)
#undef DICOMM_COUNTER_OUT
}

// Every registered transport, except optional ones not asked for. No silent fallback: a host
// without an optional transport says so once per process (an error when that transport is forced).
void Engine::open_transports(const transport::Context& ctx) {
  for (const auto& f : transport::registered_transports()) {
    if (f.optional && forced_ != "auto" && forced_ != f.name) continue;
    std::string why;
    if (auto t = f.open(ctx, &why)) {
      if (t->capabilities().version != transport::Capabilities::kVersion)
        throw Error("transport " + f.name + " describes itself with capabilities version " +
                    std::to_string(t->capabilities().version) + "; this engine reads version " +
                    std::to_string(transport::Capabilities::kVersion));
      transports_.push_back(std::move(t));
      continue;
    }
    if (forced_ == f.name)
      throw Error("DICOMM_TRANSPORT/transport=" + f.name + ", but rank " + std::to_string(rank_) + " has " + why);
    unavailable_[f.name] = why;
    static std::mutex logged_mu;
    static std::set<std::string> logged;  // once per process and transport
    std::lock_guard<std::mutex> lock(logged_mu);
    if (logged.insert(f.name).second)
      log(LogLevel::kInfo, "rank " + std::to_string(rank_) + ": no " + f.description + " transport (" + why +
                               "); peers it would serve use another transport");
  }
  std::stable_sort(transports_.begin(), transports_.end(), [](const auto& a, const auto& b) {
    return a->capabilities().preference > b->capabilities().preference;
  });
}

transport::Transport* Engine::transport_named(const std::string& name) const {
  for (const auto& t : transports_)
    if (name == t->name()) return t.get();
  return nullptr;
}

void Engine::start() {
  progress_thread_ = std::thread([this] { progress_loop(); });
  if (config_.connect_eager && size_ > 1) connector_thread_ = std::thread([this] { connect_all(); });
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
  // Its peer closed our connection and may yet tell us why (an abort notice): the send fails
  // when progress decides, with the reason decided then (progress.cpp).
  else if (!p.dead && p.closed_awaiting_until != transport::Clock::time_point{}) in_flight_[&r->send_op] = r;
  else if (p.dead || !conn || p.send.get() != conn)
    fail(*r, ErrorKind::kPeer, r->describe() + " failed: rank " + std::to_string(peer) + " is gone: " + p.dead_reason);
  else post_locked(r, *conn, peer);
  return r;
}

void Engine::post_locked(const RequestSP& r, transport::SendConn& conn, int peer) {
  const size_t bytes = r->capacity;
  if (numbered(r->tag)) r->send_op.hdr.tag_seq = sent_seq_[{peer, r->tag}]++;
  Peer& p = peers_[peer];
  if (bytes > p.register_above) r->send_op.mem = p.transport->register_memory(r->buf, bytes);
  // Eager only within the room the peer has promised (core/credits.cpp); an empty message costs none.
  const bool credited = p.credited && bytes > 0;
  if (credited && short_of_credit_locked(p, bytes)) {
    r->send_op.rendezvous = true;
    ++counters_.sends_short_of_credit;
  }
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
  if (credited && !r->send_op.rendezvous) p.eager_sent += bytes;
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
    credits_due_ |= !msg->data.empty();  // its eager bytes are taken: its sender may be owed a note
    try {
      match(r, std::move(*msg));  // a rendezvous answers the sender: that may find it gone
    } catch (const PeerError& e) {
      peer_lost(src, e.what());
    }
    if (credits_due_) return_credits_locked();
    graveyard_.clear();
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
  // (No placeholder of a timed-out receive is ever from this rank itself: Engine::time_out.)
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
  // Buffered: the send completes now, as an eager send would; past the flow-control limit on
  // unmatched bytes (as for a peer's messages) it waits for its receive like a large one.
  if (bytes <= kSelfEagerLimit && queues_.unexpected_bytes_from(rank_) < config_.unexpected_bytes) {
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
  std::map<std::string, int64_t> out;
  counters_.add_to(out);
  out["unexpected_queued"] = static_cast<int64_t>(queues_.unexpected_count());
  out["in_flight"] = static_cast<int64_t>(in_flight_.size());
  out["local_ranks_known"] = local_ranks_;
  out["spin_yield_every"] = spin_yield_every_locked();
  for (const auto& t : transports_) {  // each with the paths of the peers it serves
    std::vector<std::string> paths;
    for (const auto& p : peers_)
      if (p.transport == t.get()) paths.push_back(path_of_locked(p));
    t->add_stats(out, paths);
  }
  return out;
}

}  // namespace dicomm
