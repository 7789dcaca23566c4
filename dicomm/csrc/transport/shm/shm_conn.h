// Shared-memory connections. Small messages go eagerly through a ring of slots; large ones are
// announced (RTS) and pulled by the receiver with one copy (cross-memory attach), then acked. Where
// cross-memory attach is forbidden, the receiver asks for the data through a ring of shared chunks.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <memory>
#include <unordered_map>

#include "transport/shm/control.h"
#include "transport/shm/segment.h"
#include "transport/transport.h"

namespace dicomm::transport::shm {

// Owns the mapping of a segment.
class Mapping {
 public:
  explicit Mapping(int fd);  // maps sizeof(Segment) bytes of fd; throws Error
  ~Mapping();
  Segment* get() const { return seg_; }

 private:
  Segment* seg_ = nullptr;  // the mapping this object owns (munmap in the destructor)
};

// The transport's counters (stats()), shared with its send connections; touched under the engine lock.
struct ShmCounters {
  int64_t bytes_written_by_sender = 0;  // bytes senders copied into receivers (cross-memory attach)
  int64_t cma_unavailable = 0;          // incoming connections whose sender cannot write into us
};

class ShmSendConn : public SendConn {
 public:
  ShmSendConn(int peer, std::unique_ptr<ControlSocket> control, std::unique_ptr<Mapping> map, Sink* sink,
              int peer_pid, std::shared_ptr<ShmCounters> counters);
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "shm"; }
  bool progress(bool thorough) override;
  bool busy() const override;
  bool arm() override;
  void disarm() override;
  void post(SendOp* op) override;

 private:
  bool publish(SendOp* op);  // false if the ring is full
  bool stream_chunks();
  bool help_step();

  struct Streaming { SendOp* op; size_t offset; };
  struct Helping { SendOp* op; uint32_t share; uint64_t generation; };
  int peer_;
  std::unique_ptr<ControlSocket> control_;
  std::unique_ptr<Mapping> map_;
  Segment* seg_;  // not owned: inside map_
  Sink* sink_;    // not owned: the engine, which outlives its connections
  uint64_t next_id_ = 1;
  uint64_t published_ = 0;
  uint64_t acks_seen_ = 0;
  uint64_t chunks_published_ = 0;
  std::deque<SendOp*> waiting_;                       // for a free slot
  std::unordered_map<uint64_t, SendOp*> announced_;  // rendezvous awaiting FIN / refusal / CTS
  std::deque<Streaming> streaming_;                   // CTS received: through the chunk ring
  std::deque<Helping> helping_;                       // copying part of announced messages
  int peer_pid_;
  std::shared_ptr<ShmCounters> counters_;  // bytes_written_by_sender: what this side copied into the receiver
  bool can_write_;  // process_vm_writev into the receiver works (until it fails once)
};

class ShmRecvConn : public RecvConn {
 public:
  ShmRecvConn(int peer, std::unique_ptr<ControlSocket> control, std::unique_ptr<Mapping> map,
              Sink* sink, int peer_pid, bool cma, bool split);  // split: DICOMM_SHM_SPLIT
  ~ShmRecvConn() override;
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "shm"; }
  int64_t peer_pid() const override { return peer_pid_; }
  int64_t cma_pid() const override { return cma_ ? peer_pid_ : 0; }
  bool progress(bool thorough) override;
  bool busy() const override { return !pulls_.empty() || !unsent_acks_.empty(); }
  bool arm() override;
  void disarm() override;
  void pull(uint64_t msg_id, RecvOp* op) override;
  void refuse(uint64_t msg_id, const Refusal& why) override;
  // A matched receive given back: the sender's help is withdrawn (its write in progress awaited,
  // bounded) and its send refused as late; a piped message's chunks are read and dropped.
  bool cancel(RecvOp* op) override;

 private:
  bool read_slots();
  bool copy_step();
  bool read_chunks();
  void ack(uint32_t kind, uint64_t msg_id, uint32_t code = 0, uint64_t bytes = 0, uint64_t meta = 0);
  bool flush_acks();

  struct Pull {
    RecvOp* op = nullptr;
    uint64_t msg_id = 0;
    uint64_t src = 0;
    size_t done = 0;
    int share = 0;
    uint64_t generation = 0;
    size_t bytes = 0;
    bool dropped = false;  // cancelled: its chunks are consumed, not copied, and op is never completed
  };
  // Stops the sender's help with a share; true once no write of the sender's can land any more.
  bool withdraw_share(int share);
  struct PendingAck { uint32_t kind, code; uint64_t msg_id, bytes, meta; };
  bool copy_shared(Pull& p);
  void read_exact(char* dst, uint64_t src, size_t n);
  int peer_;
  std::unique_ptr<ControlSocket> control_;
  std::unique_ptr<Mapping> map_;
  Segment* seg_;  // not owned: inside map_
  Sink* sink_;    // not owned: the engine, which outlives its connections
  int peer_pid_;
  bool cma_;
  uint64_t consumed_ = 0;
  uint64_t acks_published_ = 0;
  uint64_t chunks_consumed_ = 0;
  std::unordered_map<uint64_t, uint64_t> announced_;  // msg_id -> sender address
  std::deque<Pull> pulls_;                            // cross-memory attach, in match order
  std::deque<Pull> piped_;                            // through the chunk ring, in CTS order
  std::deque<PendingAck> unsent_acks_;                // the ack ring was full
  bool split_ = true;
  bool share_used_[kShares] = {};
  uint64_t next_generation_ = 1;
};

}  // namespace dicomm::transport::shm
