// One reliable-connected queue pair between two ranks and what keeps it flowing: a ring of
// receive slots on each side for control messages (eager payloads, rendezvous announcements,
// completions, refusals), credits so a SEND never finds the peer without a posted receive (the
// receiver RDMA-writes its count of posted slots into the sender's credit word: no receive
// consumed, so credits can never deadlock), and RDMA reads for rendezvous data.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "transport/poller.h"
#include "transport/unique_fd.h"
#include "transport/verbs/nic.h"
#include "transport/verbs/owned.h"

namespace dicomm::transport::verbs {

// The verbs wire format's version: WireInfo, Ctrl, EagerHeader and the credit protocol. Raise it
// with any change to them; both sides must speak the same one. 0 is a peer from before the field;
// 2 carries the eager payload size in WireInfo.
constexpr uint32_t kVerbsWireVersion = 2;

// Connection data exchanged over the side channel when the queue pair is set up.
struct WireInfo {
  uint32_t magic = 0x56434944;  // "DICV"
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint32_t mtu = 0;             // IB MTU enum of the port
  uint8_t gid[16] = {};
  uint32_t gid_index = 0;
  uint32_t slots = 0;           // receive slots posted for control messages
  uint64_t credit_addr = 0;     // where the peer writes our send credits
  uint32_t credit_rkey = 0;
  uint32_t rd_atom = 0;         // RDMA reads this side serves at once (max_dest_rd_atomic)
  uint32_t version = kVerbsWireVersion;
  // The largest eager payload (DICOMM_IB_EAGER_BYTES): receive slots are 64 B more, and a SEND never
  // exceeds the peer's slot, so both sides must use the same.
  uint32_t eager_bytes = 0;
};
static_assert(sizeof(WireInfo) == 64 && offsetof(WireInfo, version) == 56 && offsetof(WireInfo, eager_bytes) == 60,
              "WireInfo is a wire format");

// "" if a peer's connection data is in a format this build speaks and its eager size is
// `eager_bytes` (this side's), else why not (for `what`).
std::string wire_mismatch(const WireInfo& remote, size_t eager_bytes);

// A control message; an eager payload follows it in the same slot.
struct Ctrl {
  uint32_t kind = 0;
  uint32_t code = 0;
  uint64_t msg_id = 0, tag = 0, meta = 0, bytes = 0;
  uint64_t addr = 0;  // rendezvous: the sender's buffer, read by the receiver
  uint32_t rkey = 0;
  uint32_t tag_seq = 0;  // Header::tag_seq
  uint64_t ready = 0;  // rendezvous: bytes the receiver may read so far (a staged copy grows)
};
static_assert(sizeof(Ctrl) == 64, "Ctrl is a wire format");
enum CtrlKind : uint32_t { kEager = 1, kRts = 2, kFin = 3, kRefuse = 4, kReady = 5 };

// An eager message travels with this short header instead of a whole Ctrl (its kind in the same
// place): the payload's size is the rest of the message, and nothing else of a Ctrl is needed for
// data that is already here. Fewer bytes to build, checksum and copy on every small message.
struct EagerHeader {
  uint32_t kind = kEager;
  uint32_t tag_seq = 0;  // Header::tag_seq
  uint64_t tag = 0, meta = 0;
};
static_assert(sizeof(EagerHeader) == 24 && offsetof(EagerHeader, kind) == offsetof(Ctrl, kind),
              "EagerHeader is a wire format");

class Channel {
 public:
  struct Handler {
    virtual ~Handler() = default;
    virtual void on_ctrl(const Ctrl& c, const char* payload) = 0;  // payload valid during the call
    virtual void on_read_done(uint64_t cookie) = 0;
  };

  // `what` names the connection in errors ("verbs connection to rank 1 (rxe0 port 1)"). Takes the
  // side channel's socket; a constructor that throws releases everything it made, that socket too.
  // Its sizes and queue pair settings come from `config` (the communicator's).
  Channel(std::shared_ptr<Nic> nic, UniqueFd side_fd, int gid_index, std::string what, Poller* poller,
          const EngineConfig& config);
  ~Channel();  // lets posted sends finish (bounded), then tears down
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  WireInfo local_info() const;
  void connect(const WireInfo& remote);  // INIT -> RTR -> RTS; throws PeerError

  size_t eager_limit() const { return slot_bytes_ - sizeof(Ctrl); }
  // Sends now or queues (copying the payload); never fails except with PeerError.
  void send_ctrl(const Ctrl& c, const void* payload = nullptr, size_t n = 0);
  bool can_read() const;
  void post_read(void* dst, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t len, uint64_t cookie);
  // Withdraws reads already posted (their receive timed out): returns once each of `cookies` has
  // completed, so that the NIC writes nothing more into their buffers. The peer's NIC answers reads
  // even while its process is stopped; while none of them completes for one retry period of the
  // queue pair (ACK timeout x (retries + 1), when the NIC itself would give up), the queue pair is
  // moved to the error state, which flushes them, and the connection is broken (the next progress
  // throws PeerError). Other completions found meanwhile are kept for the next progress pass.
  // False only if even the flush did not come within another period: the reads may still land.
  bool await_reads(std::vector<uint64_t> cookies);
  bool broken() const { return !fault_->empty(); }

  // Polls completions; throws PeerError on an error completion or an async fault, and
  // ConnectionClosed when the side channel reached EOF and nothing is left to drain.
  bool progress(Handler& h, bool thorough);
  bool pending() const { return !pending_.empty(); }  // messages wait for credits (no event will come)
  bool arm();  // requests a completion event; false if completions are already waiting
  const std::string& what() const { return what_; }
  Nic& nic() const { return *nic_; }
  std::string path_mtu_text() const;

 private:
  bool flush_pending();
  bool post_send_slot(const Ctrl& c, const void* payload, size_t n);
  void repost();  // posts the slots in consumed_ as receives (chained: one provider call per 64)
  void advertise();
  void write_credit(bool signal);      // RDMA-writes our posted count into the peer's credit word
  unsigned signal_flag(bool must);     // SEND_SIGNALED for this work request, or 0
  void retire();                       // a send-queue completion: frees it and the unsignaled before it
  void handle(const ibv::wc& wc, Handler& h);
  // A completion found while awaiting reads: `awaited` loses its cookie, the rest waits for progress.
  void set_aside(const ibv::wc& wc, std::vector<uint64_t>& awaited);
  std::chrono::milliseconds retry_period() const;  // how long the NIC retries before an error completion
  std::string wc_error(const ibv::wc& wc) const;
  [[noreturn]] void fail_wc(const ibv::wc& wc);
  void drain_events();
  bool side_closed();  // the peer closed the side channel (its process or connection is gone); sets eof_

  // Owned resources in the order they depend on each other: destroyed (or, when the constructor
  // throws, released) in reverse.
  std::shared_ptr<Nic> nic_;
  const IbvApi& api_;
  UniqueFd side_fd_;
  std::string what_;
  Poller* poller_;  // not owned: the engine's poller (null in tools without one), outlives connections
  Fault fault_ = std::make_shared<std::string>();
  // Control memory, one registration: [recv slots][send slots][credit word][posted word].
  AlignedMemory mem_;
  size_t mem_bytes_ = 0;
  OwnedMr mr_;
  OwnedCompChannel events_;
  OwnedCq cq_;
  OwnedQp qp_;
  int gid_index_;
  std::chrono::milliseconds drain_;  // the longest a close waits for posted work
  uint8_t ack_timeout_, retry_cnt_;   // of the queue pair
  uint32_t psn_ = 0;
  uint32_t mtu_ = 0;

  size_t slot_bytes_;
  int slots_;        // receive slots (and send slots)
  volatile uint64_t* credit_word_ = nullptr;  // the peer's posted receives, written by the peer
  uint64_t* posted_word_ = nullptr;           // the source of our credit writes
  uint64_t posted_ = 0, advertised_ = 0, sent_ = 0;
  // Slots whose messages were handled, posted again at the start of the next pass (or before
  // sleeping): a waiter whose message just arrived returns without the provider call, and the
  // peer's credit only counts posted slots, so it never sends into one of these. At setup: the ring.
  std::vector<int> consumed_;
  uint64_t remote_credit_addr_ = 0;
  uint32_t remote_credit_rkey_ = 0;
  std::vector<int> free_send_slots_;
  uint32_t max_inline_ = 0;

  int sq_depth_ = 0;
  // Sends and credit writes ask for a completion only every signal_every_ work requests (RC
  // completes a send queue in order, so one completion retires those before it): fewer completions
  // to make and poll per message. retire_ holds, per signaled request in flight, how many send-queue
  // entries its completion frees.
  int signal_every_ = 1, unsignaled_ = 0;
  std::deque<int> retire_;
  // Send-queue entries posted and retired so far, and the last one a close must wait for (a message
  // or a read; credit writes need not leave).
  uint64_t wr_posted_ = 0, wr_retired_ = 0, wr_needed_ = 0;
  int sq_used() const { return static_cast<int>(wr_posted_ - wr_retired_); }
  int max_reads_ = 1, reads_ = 0;
  struct Pending { Ctrl c; std::vector<char> payload; };
  std::deque<Pending> pending_;
  std::vector<ibv::wc> stash_;  // completions found while arming (or receives while awaiting reads)
  std::vector<uint64_t> reads_done_;  // reads that completed while others were awaited, not yet handled
  bool eof_ = false;
};

}  // namespace dicomm::transport::verbs
