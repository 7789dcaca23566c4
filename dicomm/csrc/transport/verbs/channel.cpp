#include "transport/verbs/channel.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <random>
#include <thread>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "transport/socket.h"

namespace dicomm::transport::verbs {
namespace {

// wr_id: kind in the top byte, slot or cookie below.
constexpr uint64_t kWrRecv = 1ull << 56, kWrSend = 2ull << 56, kWrRead = 3ull << 56, kWrCredit = 4ull << 56;
constexpr uint64_t kLow = (1ull << 56) - 1;
constexpr uint64_t kNoSlot = kLow;
constexpr int kAccess = ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_WRITE | ibv::ACCESS_REMOTE_READ;


}  // namespace

Channel::Channel(std::shared_ptr<Nic> nic, UniqueFd side_fd, int gid_index, std::string what, Poller* poller,
                 const EngineConfig& config)
    : nic_(std::move(nic)), api_(nic_->api()), side_fd_(std::move(side_fd)), what_(std::move(what)), poller_(poller),
      mr_(nullptr, {&api_}), events_(nullptr, {&api_}), cq_(nullptr, {&api_}), qp_(nullptr, {&api_}),
      gid_index_(gid_index), drain_(config.ib_drain), ack_timeout_(static_cast<uint8_t>(config.ib_timeout)),
      retry_cnt_(static_cast<uint8_t>(config.ib_retry_cnt)) {
  slots_ = config.ib_slots;
  slot_bytes_ = sizeof(Ctrl) + config.ib_eager_bytes;
  sq_depth_ = std::max(16, std::min(256, nic_->max_qp_wr()));
  signal_every_ = std::min(config.ib_signal_every, sq_depth_ / 4);
  const std::string dev = nic_->port().describe();
  auto fail = [&](const std::string& step) { throw PeerError(what_ + ": " + step + " failed on " + dev + ": " + errno_text(errno)); };

  mem_bytes_ = (2 * static_cast<size_t>(slots_) * slot_bytes_ + 16 + 4095) / 4096 * 4096;
  mem_.reset(static_cast<char*>(std::aligned_alloc(4096, mem_bytes_)));
  if (!mem_) throw Error(what_ + ": cannot allocate " + std::to_string(mem_bytes_) + " B of control memory");
  std::memset(mem_.get(), 0, mem_bytes_);
  credit_word_ = reinterpret_cast<volatile uint64_t*>(mem_.get() + 2 * slots_ * slot_bytes_);
  posted_word_ = const_cast<uint64_t*>(credit_word_) + 1;
  mr_.reset(api_.reg_mr(nic_->pd(), mem_.get(), mem_bytes_, kAccess));
  if (!mr_) fail("registering control memory");
  for (int i = slots_ - 1; i >= 0; --i) free_send_slots_.push_back(i);

  events_.reset(api_.create_comp_channel(nic_->ctx()));
  if (!events_) fail("creating a completion channel");
  fcntl(events_->fd, F_SETFL, fcntl(events_->fd, F_GETFL) | O_NONBLOCK);
  cq_.reset(api_.create_cq(nic_->ctx(), sq_depth_ + slots_ + 16, nullptr, events_.get(), 0));
  if (!cq_) fail("creating a completion queue");

  ibv::qp_init_attr init{};
  init.send_cq = cq_.get();
  init.recv_cq = cq_.get();
  init.qp_type = ibv::QPT_RC;
  // Devices differ in how much they take inline (some 64 or 101 B, some none): ask for less until one
  // fits, rather than falling from 256 B straight to none.
  for (uint32_t inline_bytes : {256u, 128u, 64u, 0u}) {
    init.cap = ibv::qp_cap{static_cast<uint32_t>(sq_depth_), static_cast<uint32_t>(slots_), 1, 1, inline_bytes};
    qp_.reset(api_.create_qp(nic_->pd(), &init));
    if (qp_) break;
  }
  if (!qp_) fail("creating an RC queue pair");
  max_inline_ = init.cap.max_inline_data;

  ibv::qp_attr a{};
  a.qp_state = ibv::QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(nic_->port().port);
  a.qp_access_flags = kAccess;
  if (api_.modify_qp(qp_.get(), &a, ibv::QP_STATE | ibv::QP_PKEY_INDEX | ibv::QP_PORT | ibv::QP_ACCESS_FLAGS)) fail("QP -> INIT");
  for (int i = 0; i < slots_; ++i) consumed_.push_back(i);
  repost();  // the whole ring
  advertised_ = posted_;
  psn_ = std::random_device{}() & 0xFFFFFF;
  // Nothing below throws: the connection is registered with the NIC's fault table and the poller
  // only once it is whole (the destructor, which runs only then, undoes both).
  nic_->watch(qp_->qp_num, fault_);
  if (poller_) {
    poller_->add(events_->fd);
    poller_->add(side_fd_.get());
  }
}

Channel::~Channel() {
  // Eager sends completed to the engine when copied: let them (and completions owed to the peer)
  // leave before the queue pair goes, within a bound. Credit writes behind the last of them are not
  // waited for, and a peer that closed its side channel has torn its queue pair down: nothing it
  // would still acknowledge (both ends closing together used to wait out the whole bound).
  auto deadline = std::chrono::steady_clock::now() + drain_;
  try {
    while (fault_->empty() && (wr_retired_ < wr_needed_ || !pending_.empty()) && std::chrono::steady_clock::now() < deadline) {
      if (side_closed()) break;  // the peer is gone
      // Unsignaled requests at the tail would never report: a signaled credit write behind them does.
      if (unsignaled_ > 0 && retire_.empty() && sq_used() < sq_depth_ && qp_) write_credit(true);
      ibv::wc wc[16];
      int n = api_.poll_cq(cq_.get(), 16, wc);
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != ibv::WC_SUCCESS) throw PeerError("error completion while draining");
        uint64_t kind = wc[i].wr_id & ~kLow;
        if (kind == kWrRecv) continue;  // the peer is closing too: nothing more to deliver
        retire();
        if (kind == kWrRead) --reads_;
        if (kind == kWrSend && (wc[i].wr_id & kLow) != kNoSlot) free_send_slots_.push_back(static_cast<int>(wc[i].wr_id & kLow));
      }
      flush_pending();
    }
  } catch (const Error&) {
  }
  if (!pending_.empty())
    log(LogLevel::kWarn, what_ + ": closing with " + std::to_string(pending_.size()) + " control message(s) unsent (the peer stopped taking them)");
  nic_->unwatch(qp_->qp_num);
  if (poller_) {
    poller_->remove(events_->fd);
    poller_->remove(side_fd_.get());
  }
  side_fd_.reset();
  qp_.reset();
  drain_events();  // a completion queue goes only once its events are acknowledged
  // The members release the rest in reverse order: completion queue, channel, registration, memory.
}

WireInfo Channel::local_info() const {
  WireInfo w;
  w.qpn = qp_->qp_num;
  w.psn = psn_;
  w.mtu = nic_->port().active_mtu;
  ibv::gid g{};
  if (api_.query_gid(nic_->ctx(), static_cast<uint8_t>(nic_->port().port), gid_index_, &g))
    throw PeerError(what_ + ": cannot read GID " + std::to_string(gid_index_) + " of " + nic_->port().describe());
  std::memcpy(w.gid, g.raw, 16);
  w.gid_index = static_cast<uint32_t>(gid_index_);
  w.slots = static_cast<uint32_t>(slots_);
  w.credit_addr = reinterpret_cast<uintptr_t>(credit_word_);
  w.credit_rkey = mr_->rkey;
  w.rd_atom = static_cast<uint32_t>(std::max(1, std::min(16, nic_->max_rd_atom())));
  w.eager_bytes = static_cast<uint32_t>(eager_limit());
  return w;
}

std::string wire_mismatch(const WireInfo& r, size_t eager_bytes) {
  if (r.magic != WireInfo{}.magic) return "the peer sent malformed connection data (not a dicomm verbs peer)";
  if (r.version != kVerbsWireVersion)
    return "the peer speaks verbs wire version " + std::to_string(r.version) + ", this rank speaks version " +
           std::to_string(kVerbsWireVersion) + " (run the same dicomm release on every rank)";
  if (r.eager_bytes != eager_bytes)
    return "the peer's eager messages are up to " + std::to_string(r.eager_bytes) + " B (its DICOMM_IB_EAGER_BYTES=" +
           std::to_string(r.eager_bytes) + "), this rank's up to " + std::to_string(eager_bytes) +
           " B (DICOMM_IB_EAGER_BYTES=" + std::to_string(eager_bytes) +
           "): both sides size their receive slots by it, so every rank must set the same";
  return "";
}

void Channel::connect(const WireInfo& r) {
  if (std::string why = wire_mismatch(r, eager_limit()); !why.empty()) throw PeerError(what_ + ": " + why);
  const std::string dev = nic_->port().describe();
  mtu_ = std::min(r.mtu, nic_->port().active_mtu);
  *credit_word_ = r.slots;
  remote_credit_addr_ = r.credit_addr;
  remote_credit_rkey_ = r.credit_rkey;
  int local_rd = static_cast<int>(std::max(1, std::min(16, nic_->max_rd_atom())));
  max_reads_ = std::max(1, std::min<int>(local_rd, static_cast<int>(r.rd_atom)));
  ibv::qp_attr a{};
  a.qp_state = ibv::QPS_RTR;
  a.path_mtu = mtu_;
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(local_rd);
  a.min_rnr_timer = 12;
  a.ah.is_global = 1;
  std::memcpy(a.ah.grh.dgid.raw, r.gid, 16);
  a.ah.grh.sgid_index = static_cast<uint8_t>(gid_index_);
  a.ah.grh.hop_limit = 64;
  a.ah.port_num = static_cast<uint8_t>(nic_->port().port);
  int mask = ibv::QP_STATE | ibv::QP_AV | ibv::QP_PATH_MTU | ibv::QP_DEST_QPN | ibv::QP_RQ_PSN |
             ibv::QP_MAX_DEST_RD_ATOMIC | ibv::QP_MIN_RNR_TIMER;
  if (api_.modify_qp(qp_.get(), &a, mask))
    throw PeerError(what_ + ": QP -> RTR failed on " + dev + " (GID index " + std::to_string(gid_index_) + ", peer QP " +
                    std::to_string(r.qpn) + "): " + errno_text(errno) + "; check DICOMM_IB_GID_INDEX and the peer's GID");
  a = ibv::qp_attr{};
  a.qp_state = ibv::QPS_RTS;
  a.timeout = ack_timeout_;
  a.retry_cnt = retry_cnt_;
  a.rnr_retry = 7;
  a.sq_psn = psn_;
  a.max_rd_atomic = static_cast<uint8_t>(max_reads_);
  mask = ibv::QP_STATE | ibv::QP_TIMEOUT | ibv::QP_RETRY_CNT | ibv::QP_RNR_RETRY | ibv::QP_SQ_PSN | ibv::QP_MAX_QP_RD_ATOMIC;
  if (api_.modify_qp(qp_.get(), &a, mask)) throw PeerError(what_ + ": QP -> RTS failed on " + dev + ": " + errno_text(errno));
}

void Channel::repost() {
  if (consumed_.empty()) return;
  ibv::sge sges[64];
  ibv::recv_wr wrs[64];
  size_t done = 0;
  while (done < consumed_.size()) {  // chains of up to 64: one lock and queue update per chain
    const size_t n = std::min<size_t>(64, consumed_.size() - done);
    for (size_t i = 0; i < n; ++i) {
      const int slot = consumed_[done + i];
      sges[i] = ibv::sge{reinterpret_cast<uintptr_t>(mem_.get() + static_cast<size_t>(slot) * slot_bytes_),
                         static_cast<uint32_t>(slot_bytes_), mr_->lkey};
      wrs[i] = ibv::recv_wr{};
      wrs[i].wr_id = kWrRecv | static_cast<uint64_t>(slot);
      wrs[i].sg_list = &sges[i];
      wrs[i].num_sge = 1;
      wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    ibv::recv_wr* bad = nullptr;
    if (IbvApi::post_recv(qp_.get(), wrs, &bad)) throw PeerError(what_ + ": posting receives failed: " + errno_text(errno));
    done += n;
    posted_ += n;
  }
  consumed_.clear();
}

void Channel::send_ctrl(const Ctrl& c, const void* payload, size_t n) {
  if (pending_.empty() && post_send_slot(c, payload, n)) return;
  Pending p{c, {}};
  if (n) p.payload.assign(static_cast<const char*>(payload), static_cast<const char*>(payload) + n);
  pending_.push_back(std::move(p));
}

bool Channel::post_send_slot(const Ctrl& c, const void* payload, size_t n) {
  if (sent_ >= *credit_word_ || sq_used() >= sq_depth_) return false;  // no receive posted yet, or SQ full
  const bool eager = c.kind == kEager;
  const size_t head = eager ? sizeof(EagerHeader) : sizeof(Ctrl);
  const size_t total = head + n;
  alignas(64) char inline_buf[256];
  const bool inl = total <= max_inline_ && total <= sizeof(inline_buf);
  uint64_t slot = kNoSlot;
  char* src = inline_buf;
  if (!inl) {
    if (free_send_slots_.empty()) return false;
    slot = static_cast<uint64_t>(free_send_slots_.back());
    free_send_slots_.pop_back();
    src = mem_.get() + (static_cast<size_t>(slots_) + slot) * slot_bytes_;
  }
  if (eager) {
    EagerHeader e;
    e.tag = c.tag;
    e.meta = c.meta;
    e.tag_seq = c.tag_seq;
    std::memcpy(src, &e, sizeof(e));
  } else {
    std::memcpy(src, &c, sizeof(Ctrl));
  }
  if (n) std::memcpy(src + head, payload, n);
  ibv::sge s{reinterpret_cast<uintptr_t>(src), static_cast<uint32_t>(total), mr_->lkey};
  ibv::send_wr wr{};
  wr.wr_id = kWrSend | slot;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = ibv::WR_SEND;
  // A registered send slot is reused only after its completion: those are always signaled.
  wr.send_flags = signal_flag(!inl) | (inl ? ibv::SEND_INLINE : 0u);
  ibv::send_wr* bad = nullptr;
  if (IbvApi::post_send(qp_.get(), &wr, &bad)) throw PeerError(what_ + ": posting a send failed: " + errno_text(errno));
  ++sent_;
  wr_needed_ = ++wr_posted_;
  return true;
}

bool Channel::flush_pending() {
  bool did = false;
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    if (!post_send_slot(p.c, p.payload.data(), p.payload.size())) break;
    pending_.pop_front();
    did = true;
  }
  return did;
}

bool Channel::can_read() const { return reads_ < max_reads_ && sq_used() < sq_depth_; }

void Channel::post_read(void* dst, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t len, uint64_t cookie) {
  ibv::sge s{reinterpret_cast<uintptr_t>(dst), len, lkey};
  ibv::send_wr wr{};
  wr.wr_id = kWrRead | (cookie & kLow);
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = ibv::WR_RDMA_READ;
  wr.send_flags = signal_flag(true);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  ibv::send_wr* bad = nullptr;
  if (IbvApi::post_send(qp_.get(), &wr, &bad)) throw PeerError(what_ + ": posting an RDMA read failed: " + errno_text(errno));
  ++reads_;
  wr_needed_ = ++wr_posted_;
}

unsigned Channel::signal_flag(bool must) {
  if (must || unsignaled_ + 1 >= signal_every_ || sq_used() + 1 >= sq_depth_) {
    retire_.push_back(unsignaled_ + 1);
    unsignaled_ = 0;
    return ibv::SEND_SIGNALED;
  }
  ++unsignaled_;
  return 0;
}

void Channel::retire() {
  if (retire_.empty()) throw PeerError(what_ + ": a send-queue completion nobody asked for");
  wr_retired_ += static_cast<uint64_t>(retire_.front());
  retire_.pop_front();
}

void Channel::advertise() {
  if (posted_ - advertised_ < static_cast<uint64_t>(slots_ / 2) || sq_used() >= sq_depth_) return;
  write_credit(false);
}

void Channel::write_credit(bool signal) {
  *posted_word_ = posted_;
  ibv::sge s{reinterpret_cast<uintptr_t>(posted_word_), 8, mr_->lkey};
  ibv::send_wr wr{};
  wr.wr_id = kWrCredit;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = ibv::WR_RDMA_WRITE;
  // Without inline data the NIC reads the word after the post; a later, larger count written over it
  // meanwhile only advertises more credit.
  wr.send_flags = signal_flag(signal) | (max_inline_ >= 8 ? ibv::SEND_INLINE : 0u);
  wr.wr.rdma.remote_addr = remote_credit_addr_;
  wr.wr.rdma.rkey = remote_credit_rkey_;
  ibv::send_wr* bad = nullptr;
  if (IbvApi::post_send(qp_.get(), &wr, &bad)) throw PeerError(what_ + ": posting a credit update failed: " + errno_text(errno));
  advertised_ = posted_;
  ++wr_posted_;
}

std::string Channel::wc_error(const ibv::wc& wc) const {
  uint64_t kind = wc.wr_id & ~kLow;
  const char* op = kind == kWrRecv ? "a receive" : kind == kWrSend ? "a send" : kind == kWrRead ? "an RDMA read" : "a credit write";
  std::string hint;
  if (wc.status == ibv::WC_RETRY_EXC_ERR)
    hint = " (transport retries exhausted: the peer stopped answering, its process died, or the GID/route to it is wrong)";
  else if (wc.status == ibv::WC_RNR_RETRY_EXC_ERR)
    hint = " (the peer posted no receive in time)";
  else if (wc.status == ibv::WC_WR_FLUSH_ERR)
    hint = " (the queue pair is in error state)";
  char vendor[16];
  std::snprintf(vendor, sizeof(vendor), "0x%x", wc.vendor_err);
  return "[" + nic_->port().describe() + ", GID index " + std::to_string(gid_index_) + "]: " + op + " completed with '" +
         api_.wc_status_str(wc.status) + "' (status " + std::to_string(wc.status) + ", vendor error " + vendor + ")" + hint;
}

void Channel::fail_wc(const ibv::wc& wc) { throw PeerError(what_ + " " + wc_error(wc)); }

void Channel::handle(const ibv::wc& wc, Handler& h) {
  if (wc.status != ibv::WC_SUCCESS) fail_wc(wc);
  const uint64_t kind = wc.wr_id & ~kLow, low = wc.wr_id & kLow;
  if (kind == kWrRecv) {
    const char* p = mem_.get() + low * slot_bytes_;
    Ctrl c;
    uint32_t msg_kind = 0;
    if (wc.byte_len >= sizeof(msg_kind)) std::memcpy(&msg_kind, p, sizeof(msg_kind));
    size_t head = sizeof(Ctrl);
    if (msg_kind == kEager && wc.byte_len >= sizeof(EagerHeader)) {
      EagerHeader e;
      std::memcpy(&e, p, sizeof(e));
      head = sizeof(e);
      c.kind = kEager;
      c.tag = e.tag;
      c.meta = e.meta;
      c.tag_seq = e.tag_seq;
      c.bytes = wc.byte_len - head;
    } else if (msg_kind != kEager && wc.byte_len >= sizeof(Ctrl)) {
      std::memcpy(&c, p, sizeof(Ctrl));
    } else {
      throw ProtocolError(what_ + ": malformed control message (" + std::to_string(wc.byte_len) + " B, kind " +
                      std::to_string(msg_kind) + ")");
    }
    h.on_ctrl(c, p + head);
    consumed_.push_back(static_cast<int>(low));
    return;
  }
  retire();
  if (kind == kWrSend && low != kNoSlot) free_send_slots_.push_back(static_cast<int>(low));
  if (kind == kWrRead) {
    --reads_;
    h.on_read_done(low);
  }
}

std::chrono::milliseconds Channel::retry_period() const {
  // 4.096 us x 2^timeout per try, retry_cnt retries after the first; at least 10 ms, at most a minute.
  const double us = 4.096 * static_cast<double>(1ull << ack_timeout_) * (retry_cnt_ + 1);
  return std::chrono::milliseconds(static_cast<long>(std::clamp(us / 1000.0, 10.0, 60000.0)));
}

void Channel::set_aside(const ibv::wc& wc, std::vector<uint64_t>& awaited) {
  const uint64_t kind = wc.wr_id & ~kLow, low = wc.wr_id & kLow;
  auto awaited_read = [&] {
    auto it = std::find(awaited.begin(), awaited.end(), low);
    if (kind != kWrRead || it == awaited.end()) return false;
    awaited.erase(it);
    return true;
  };
  if (wc.status != ibv::WC_SUCCESS) {  // the queue pair is in error: every later request is flushed
    if (fault_->empty()) *fault_ = wc_error(wc);
    awaited_read();
    return;
  }
  if (kind == kWrRecv) {
    stash_.push_back(wc);  // a message: delivered by the next progress pass
    return;
  }
  retire();
  if (kind == kWrSend && low != kNoSlot) free_send_slots_.push_back(static_cast<int>(low));
  if (kind == kWrRead) {
    --reads_;
    if (!awaited_read()) reads_done_.push_back(low);
  }
}

bool Channel::await_reads(std::vector<uint64_t> cookies) {
  auto earlier = std::move(stash_);  // found while arming, not handled yet: sorted the same way
  stash_.clear();
  for (const auto& wc : earlier) set_aside(wc, cookies);
  const auto period = retry_period();
  bool flushing = false;
  auto last = std::chrono::steady_clock::now();
  while (!cookies.empty()) {
    ibv::wc wc[16];
    const int n = IbvApi::poll_cq(cq_.get(), 16, wc);
    if (n < 0) break;
    const size_t before = cookies.size();
    for (int i = 0; i < n; ++i) set_aside(wc[i], cookies);
    const auto now = std::chrono::steady_clock::now();
    if (cookies.size() < before) last = now;
    if (now - last < period) {
      if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // the peer's NIC is serving them
      continue;
    }
    if (flushing) break;  // not even flushed: the NIC may still write
    // No answer for a whole retry period: stop them here. The error state flushes every posted request.
    ibv::qp_attr a{};
    a.qp_state = ibv::QPS_ERR;
    api_.modify_qp(qp_.get(), &a, ibv::QP_STATE);
    if (fault_->empty())
      *fault_ = "a receive timed out while " + std::to_string(cookies.size()) + " RDMA read(s) of it got no answer for " +
                std::to_string(period.count()) + " ms; the queue pair was put in the error state to stop them";
    flushing = true;
    last = now;
  }
  return cookies.empty();
}

bool Channel::side_closed() {
  if (eof_) return true;
  char byte;  // nothing is sent on it after the handshake: a read finds EOF or nothing
  ssize_t r = recv(side_fd_.get(), &byte, 1, MSG_DONTWAIT);
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof_ = true;
  return eof_;
}

void Channel::drain_events() {
  ibv::cq* cq = nullptr;
  void* ctx = nullptr;
  while (events_ && api_.get_cq_event(events_.get(), &cq, &ctx) == 0) api_.ack_cq_events(cq, 1);
}

bool Channel::progress(Handler& h, bool thorough) {
  if (!fault_->empty()) throw PeerError(what_ + ": " + *fault_);
  const bool eof_before = eof_;
  bool did = false;
  repost();
  if (!stash_.empty()) {
    auto stash = std::move(stash_);
    stash_.clear();
    for (const auto& wc : stash) handle(wc, h);
    did = true;
  }
  if (!reads_done_.empty()) {  // completed while another receive's reads were awaited
    auto done = std::move(reads_done_);
    reads_done_.clear();
    for (uint64_t cookie : done) h.on_read_done(cookie);
    did = true;
  }
  ibv::wc wc[16];
  for (int round = 0; round < 8; ++round) {
    int n = IbvApi::poll_cq(cq_.get(), 16, wc);
    if (n < 0) throw PeerError(what_ + ": polling the completion queue failed");
    for (int i = 0; i < n; ++i) handle(wc[i], h);
    did |= n > 0;
    if (n < 16) break;
  }
  did |= flush_pending();
  advertise();
  if (thorough) {
    drain_events();
    side_closed();
  }
  if (eof_before && eof_ && !did) throw ConnectionClosed(what_ + ": the peer closed the connection");
  return did;
}

bool Channel::arm() {
  repost();  // a sleeping receiver must have given every handled slot back, credit included
  advertise();
  if (!stash_.empty() || !reads_done_.empty()) return false;
  if (!pending_.empty() && sent_ < *credit_word_) return false;
  IbvApi::req_notify_cq(cq_.get());
  ibv::wc wc{};
  if (IbvApi::poll_cq(cq_.get(), 1, &wc) > 0) {  // arrived before the request: would never raise an event
    stash_.push_back(wc);
    return false;
  }
  return true;
}

std::string Channel::path_mtu_text() const { return std::to_string(ibv::mtu_bytes(mtu_)) + " B"; }

}  // namespace dicomm::transport::verbs
