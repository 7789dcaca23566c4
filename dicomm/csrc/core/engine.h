// The point-to-point engine behind a Communicator: peers and their connections, matching, the
// progress thread, failure handling. One lock guards all of it; whoever holds it may progress
// (threads, locks and ownership: docs/architecture.md, "Threads, locks and ownership").
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/communicator.h"
#include "core/matching.h"
#include "core/p2p_request.h"
#include "transport/poller.h"
#include "transport/transport.h"

namespace dicomm {

// The engine's counters, reported by stats() under these names; touched only under the engine lock.
// waits_unspun: waits that blocked at once (the host had more runnable tasks than CPUs).
// sends_short_of_credit: sends posted when the peer had promised no room for their bytes (they go
// as rendezvous); credit_notes_sent: notes telling a sender what was taken (core/credits.cpp).
#define DICOMM_ENGINE_COUNTERS(X)                                                                   \
  X(rejected_connections) X(connections_accepted) X(connections_opened) X(messages_sent)          \
  X(messages_received) X(bytes_sent) X(bytes_received) X(unexpected_messages)                     \
  X(late_messages_discarded) X(sends_short_of_credit) X(credit_notes_sent) X(peers_lost)          \
  X(waits_unspun) X(protocol_violations)
struct EngineCounters {
#define DICOMM_COUNTER_FIELD(name) int64_t name = 0;
  DICOMM_ENGINE_COUNTERS(DICOMM_COUNTER_FIELD)
#undef DICOMM_COUNTER_FIELD
  void add_to(std::map<std::string, int64_t>& out) const;
};

class Engine : public transport::Sink, public std::enable_shared_from_this<Engine> {
 public:
  Engine(std::shared_ptr<Store> store, int rank, int size, const Options& options);
  ~Engine() override;
  void start();  // the progress thread (needs shared_from_this, so not in the constructor)

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const EngineConfig& config() const { return config_; }

  RequestPtr isend(const void* buf, size_t bytes, int peer, Tag tag, uint64_t meta);
  RequestPtr irecv(void* buf, size_t bytes, int peer, Tag tag, uint64_t meta);
  // Returns once r is done (throwing its error) or, without throwing, once `give_up` holds.
  void wait(P2PRequest& r, std::chrono::milliseconds timeout,
            const std::function<bool()>* give_up = nullptr);  // progress.cpp
  void poke();                                                  // one non-blocking progress pass

  std::string transport_of(int peer) const;
  std::string awaited_cards() const { return bootstrap_.awaited_cards(); }  // Bootstrap::awaited_cards
  int64_t cma_pid(int peer) const;  // connections.cpp; Communicator::cma_pid
  std::map<std::string, int64_t> stats() const;
  // Fails everything pending; with `tell_peers`, first sends each connected peer an abort notice
  // (they fail their pending requests with `kind`, naming this rank and `reason`).
  void abort(const std::string& reason, ErrorKind kind = ErrorKind::kPeer, bool tell_peers = false,
             uint64_t collective_seq = ~uint64_t{0});
  void close();

 private:
  using RequestSP = std::shared_ptr<P2PRequest>;
  struct CreditNote {  // outgoing: the eager bytes taken from its peer so far
    transport::SendOp op;
    uint64_t taken = 0;
    bool posted = false;  // in the transport until on_send_done
  };
  struct Peer {
    bool card_known = false;
    Card card;
    std::unique_ptr<CreditNote> credit_note;  // before `send`: it outlives the connection it is posted on
    std::unique_ptr<transport::SendConn> send;
    std::vector<std::shared_ptr<transport::RecvConn>> recv;
    // Connections from a process on this host that arrived before the peer's card was read: not
    // progressed (nothing they carry is delivered) until the card says whether that process is
    // the rank (settle_held_locked).
    std::vector<std::shared_ptr<transport::RecvConn>> held;
    // Not owned: one of transports_, which live as long as the engine. Null until first contact
    // (set_transport_locked), which also copies the two capabilities read on every message.
    transport::Transport* transport = nullptr;
    std::chrono::microseconds spin{0};  // a waiter's spin budget for this transport (progress.cpp)
    size_t register_above = ~size_t{0};  // its registration threshold (Capabilities::register_above)
    bool dead = false;         // nothing more to or from this peer
    bool send_closed = false;  // it closed our send connection; its messages may still drain
    bool local = false;        // known to run on this host (its card, or a shared-memory connection)
    std::string dead_reason;
    std::unique_ptr<std::mutex> connecting = std::make_unique<std::mutex>();
    int pidfd = -1;  // same-host peer: readable once its process exits (liveness.cpp)
    // Eager credits (core/credits.cpp), kept where its transport has no flow control of its own.
    // As a sender: eager bytes sent to it, and how many of them it said it has taken. As a
    // receiver: eager bytes received from it, and how many taken ones it has been told of.
    bool credited = false;
    uint64_t eager_sent = 0, eager_taken = 0;
    uint64_t eager_received = 0, eager_told = 0;
    // It closed our send connection before connecting to us: until then its connection (which
    // may carry an abort notice) may still come; decided by later progress passes (progress.cpp).
    transport::Clock::time_point closed_awaiting_until{};
  };

  // Sink (engine lock held).
  void on_accept(std::shared_ptr<transport::RecvConn> conn) override;
  void on_rejected(const std::string& why) override;
  std::string impostor_locked(const Peer& p, const transport::RecvConn& conn) const;  // "" if not
  void admit_locked(Peer& p, std::shared_ptr<transport::RecvConn> conn);  // checked: it may deliver
  // connections.cpp: the peer's card is known from now on; held connections are admitted or refused.
  void learn_card_locked(int peer, const Card& card);
  void settle_held_locked(Peer& p);
  void read_held_cards();  // the card reader thread: cards of peers with held connections
  std::thread card_reader_;
  bool card_reader_running_ = false;
  std::atomic<int> held_{0};  // held connections, all peers: the pollers must not spin on them
  void sleep_in_poller(int ms);  // lock NOT held
  std::chrono::steady_clock::time_point rejections_logged_at_{};
  int64_t rejections_unlogged_ = 0;
  void on_message(transport::RecvConn& conn, const transport::Header& hdr, const void* payload) override;
  void on_send_done(transport::SendOp* op) override;
  void on_send_refused(transport::SendOp* op, const transport::Refusal& why) override;
  void on_recv_done(transport::RecvOp* op) override;

  // engine.cpp
  transport::SendConn* connection_to(int peer);  // connects on first use; lock NOT held
  // Who connects: a send (on first use), the connector thread (every peer at once), or an abort's notice.
  // A connection that opens after the abort told the peers carries the notice (tell_late_connection_locked):
  // the connector goes on after such an abort, so that a peer it had not reached yet hears it instead of
  // nothing; the notice does not wait for another thread's attempt (that one will carry it).
  enum class ConnectFor { kUse, kConnector, kNotice };
  transport::SendConn* connection_to(int peer, transport::Clock::time_point deadline,
                                     ConnectFor why = ConnectFor::kUse);
  void connect_all();  // the connector thread: every peer at once, so that a dead one is noticed

  // liveness.cpp (lock held)
  void watch_process_locked(int peer, Peer& p);  // same-host peer: a pidfd on its process
  bool check_processes_locked();                 // peers whose process exited are lost
  void unwatch_process_locked(Peer& p);
  void exited_locked(int peer, const std::string& why);  // its process is gone: read what it sent, then lose it
  // Abort notices: a reserved tag on the ordinary connections (liveness.cpp).
  void connect_for_notice();  // before an abort that tells the peers (failure.cpp)
  void send_abort_notices_locked(const std::string& reason, ErrorKind kind, uint64_t collective_seq);
  void tell_late_connection_locked(transport::SendConn& conn);  // connection_to, after we told them
  bool post_abort_notice_locked(transport::SendConn& conn);     // false: that connection is gone
  static void push_abort_notices(const std::vector<transport::SendConn*>& told);
  static bool is_abort_notice(const transport::Header& hdr);
  bool on_abort_notice(int src, const void* payload, size_t bytes);  // true if it was one
  void apply_abort_notice_locked();  // after a progress pass (connections may not be freed mid-pass)
  // credits.cpp (lock held)
  bool short_of_credit_locked(const Peer& p, size_t bytes) const;  // a send of `bytes` must be announced
  static bool is_credit_note(const transport::Header& hdr);
  void on_credit_note(int src, const void* payload, size_t bytes);
  void received_eager_locked(int src, size_t bytes);  // an eager payload from src was read
  void return_credits_locked();                       // notes to senders owed one
  bool credit_note_sent(transport::SendOp* op);       // true if op was a credit note
  bool credits_due_ = false;                          // something was taken since the last look
  transport::Transport& choose_transport(int peer, const Card& card);
  void open_transports(const transport::Context& ctx);  // engine.cpp: from the registry
  transport::Transport* transport_named(const std::string& name) const;  // null when not open here
  std::string path_of_locked(const Peer& p) const;   // connections.cpp: "verbs/cpu-mediated"...
  void post_locked(const RequestSP& r, transport::SendConn& conn, int peer);
  // Lock held. `payload`: an eager payload still in the transport (else msg.data holds it).
  void match(const RequestSP& r, Unexpected&& msg, const void* payload = nullptr);
  bool fits(P2PRequest& r, int src, const transport::Header& hdr, transport::Refusal* refusal);
  bool discard_if_late(transport::RecvConn& conn, const transport::Header& hdr, const void* payload);
  // Discards a late message: counted, logged, a rendezvous sender's send fails as timed out.
  void drop_late_locked(transport::RecvConn& conn, const transport::Header& hdr, const void* payload);
  // Late messages by number: each (peer, tag) stream of point-to-point messages is numbered by its
  // sender (Header::tag_seq); a receive that times out unmatched records the number it would have
  // taken, and exactly that message is discarded. Collective tags are used once: never numbered.
  static bool numbered(Tag tag) { return !(tag & kCollectiveTagBit); }
  std::map<std::pair<int, Tag>, uint32_t> sent_seq_;      // (destination, tag) -> next number
  std::map<std::pair<int, Tag>, uint32_t> received_seq_;  // (source, tag) -> next number to arrive
  std::map<std::pair<int, Tag>, std::set<uint32_t>> late_;  // (source, tag) -> numbers given up on
  void give_up_locked(const P2PRequest& r, size_t ahead);  // r timed out with `ahead` receives before it
  void send_to_self(const RequestSP& r);
  void peer_lost(int peer, const std::string& why);
  void peer_failed(int peer, const PeerError& e);  // peer_lost, counting a ProtocolError
  void send_side_closed(int peer, const std::string& why);
  // Reads the other peers' receive connections for an abort notice already sent to us (lock held).
  bool notice_waiting_locked(int closing);
  void fail_everything(const std::string& why, bool free_now = true);  // each with kind_for_locked
  void finish(P2PRequest& r, int source, size_t nbytes);
  void release_memory(P2PRequest& r);  // deregisters what isend/match registered
  void fail(P2PRequest& r, ErrorKind kind, const std::string& text);
  RequestSP failed_request(P2PRequest::Op op, int peer, Tag tag, uint64_t meta, void* buf, size_t bytes,
                           ErrorKind kind, const std::string& why);

  // progress.cpp (lock held unless noted)
  bool progress_locked(bool thorough);
  bool arm_locked();
  std::chrono::microseconds spin_budget_locked(const P2PRequest& r) const;
  void note_local_locked(Peer& p);  // counts `p` among the ranks on this host (once)
  // Names the transport of `p`'s traffic and looks up its spin budget once: a waiter reads it
  // at every wait, where comparing transport names cost more than the rest of the spin's setup.
  void set_transport_locked(Peer& p, transport::Transport& t);
  int spin_yield_every_locked() const;
  void disarm_locked();
  void progress_loop();  // the progress thread; lock not held
  void progress_loop_locked(std::unique_lock<std::mutex>& lock);
  [[noreturn]] void time_out(P2PRequest& r, std::chrono::milliseconds timeout);
  bool cancel_matched_locked(P2PRequest& r);  // a receive whose data is on its way: stop it landing

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const EngineConfig config_;  // parsed once, when the communicator is created
  std::string forced_;  // "auto" or the name of a registered transport
  // Optional transports this host cannot run, by name, with the reason (logged once per process).
  std::map<std::string, std::string> unavailable_;
  Bootstrap bootstrap_;
  Card card_;

  mutable std::mutex mu_;
  std::condition_variable done_cv_;  // blocked waiters
  std::condition_variable idle_cv_;  // the progress thread, parked while callers drive progress
  // Callers spinning, or sleeping in epoll themselves, and when the last one stopped (steady_clock
  // ticks). Atomic so that a spin whose request completed stops driving without taking the lock again.
  std::atomic<int> driving_{0};
  std::atomic<std::chrono::steady_clock::rep> driven_at_{0};
  // The time first, then the count: the progress thread never pairs a count of 0 with an older time.
  void stop_driving(std::chrono::steady_clock::time_point when) {
    driven_at_.store(when.time_since_epoch().count());
    --driving_;
  }
  std::chrono::steady_clock::time_point driven_at() const {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(driven_at_.load()));
  }
  bool caller_polling_ = false;      // one caller sleeps in epoll (a completion elsewhere must wake it)
  // Spinning callers give the CPU away only when this host's ranks outnumber the CPUs they may run on.
  const int cpus_;                   // CPUs in this process's affinity mask
  int local_ranks_ = 1;              // this rank and the peers known to be on this host
  int blocked_ = 0;
  bool stop_ = false;
  bool closed_ = false;
  std::string abort_reason_;
  // The failed collective's requests fail with abort_kind_ (a mismatch stays a MismatchError on
  // every rank); every other request with PeerError.
  ErrorKind abort_kind_ = ErrorKind::kPeer;
  uint64_t abort_seq_ = ~uint64_t{0};
  ErrorKind kind_for_locked(const P2PRequest& r) const;

  std::unique_ptr<transport::Poller> poller_;
  // The open transports, by descending preference (the order auto tries them in).
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<Peer> peers_;
  std::vector<std::shared_ptr<transport::Conn>> graveyard_;  // closed after the current pass
  MatchQueues queues_;
  std::unordered_map<const void*, RequestSP> in_flight_;  // by &send_op / &recv_op
  // The send inside conn.post() right now: most small sends complete there (copied out eagerly),
  // and those never enter in_flight_ (a hash-map insert and erase less on the latency path).
  const RequestSP* posting_ = nullptr;
  RequestSP take_in_flight(const void* op);  // the request of `op`, removed from in_flight_ (or null)
  std::thread progress_thread_;
  std::thread connector_thread_;
  std::atomic<bool> stopping_{false};  // close() began: the connector gives up
  // An abort notice received during a progress pass, applied after it.
  bool notice_pending_ = false;
  ErrorKind notice_kind_ = ErrorKind::kPeer;
  uint64_t notice_seq_ = ~uint64_t{0};
  std::string notice_text_;
  struct Notice {
    transport::SendOp op;
    std::string text;
  };
  std::vector<std::unique_ptr<Notice>> notices_;  // outgoing: alive until the engine goes
  struct Told {  // the abort notice this rank sent its peers, if it did
    std::string reason;
    ErrorKind kind;
    uint64_t collective_seq;
  };
  std::optional<Told> told_;
  EngineCounters counters_;
};

}  // namespace dicomm
