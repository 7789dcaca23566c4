// Verbs connections. Small messages travel eagerly inside a control message (copied into a
// registered slot, inline when the device allows). Large ones use rendezvous by RDMA read: the
// sender announces its registered buffer (address, rkey); once the engine has matched the message,
// the receiver reads it straight into the destination in pipelined chunks (several reads in
// flight) and then tells the sender it is done. Pull suits the transport interface (only the
// receiver knows where a message lands, after matching) and saves the clear-to-send round trip
// that a sender-side RDMA write would need. A buffer the NIC cannot register goes through a registered
// host copy on both sides; the sender copies it chunk by chunk during progress and tells the receiver
// how far it may read (kReady), so the copy-in overlaps the reads.
#pragma once

#include <deque>
#include <memory>
#include <unordered_map>

#include "transport/transport.h"
#include "transport/verbs/channel.h"
#include "transport/verbs/staging.h"

namespace dicomm::transport::verbs {

// What a peer's traffic has used so far, for transport_of: host memory, device-direct or staged.
struct PathStats {
  bool device_direct = false;
  bool cpu_mediated = false;
  std::string describe() const;  // "verbs", "verbs/device-direct", "verbs/cpu-mediated"
};

class VerbsSendConn : public SendConn, private Channel::Handler {
 public:
  VerbsSendConn(int peer, std::unique_ptr<Channel> ch, Sink* sink, size_t chunk_bytes);
  ~VerbsSendConn() override;
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "verbs"; }
  bool progress(bool thorough) override;
  bool busy() const override { return ch_->pending() || staging_ > 0; }
  bool arm() override { return staging_ == 0 && ch_->arm(); }
  void post(SendOp* op) override;
  const PathStats& path() const { return path_; }

 private:
  void on_ctrl(const Ctrl& c, const char* payload) override;
  void on_read_done(uint64_t) override {}

  bool stage_more();  // copies the next chunk of every partly staged message and announces it

  struct Rendezvous {
    SendOp* op;
    Registration* reg;
    std::unique_ptr<HostBuffer> staged;  // CPU-mediated: the registered host copy
    size_t ready = 0;                    // bytes of it copied and announced
  };
  int peer_;
  std::unique_ptr<Channel> ch_;
  Sink* sink_;  // not owned: the engine, which outlives its connections
  size_t chunk_;
  int staging_ = 0;  // messages whose host copy is not complete yet
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Rendezvous> rendezvous_;
  PathStats path_;
};

class VerbsRecvConn : public RecvConn, private Channel::Handler {
 public:
  VerbsRecvConn(int peer, std::unique_ptr<Channel> ch, Sink* sink, size_t chunk_bytes);
  ~VerbsRecvConn() override;
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "verbs"; }
  bool progress(bool thorough) override;
  bool busy() const override { return ch_->pending(); }
  bool arm() override { return ch_->arm(); }
  void pull(uint64_t msg_id, RecvOp* op) override;
  void refuse(uint64_t msg_id, const Refusal& why) override;
  // A pulled message whose receive timed out: no further read is posted, the reads on the wire are
  // awaited (Channel::await_reads), and the sender is answered kRefuse (kLate).
  bool cancel(RecvOp* op) override;
  const PathStats& path() const { return path_; }

 private:
  void on_ctrl(const Ctrl& c, const char* payload) override;
  void on_read_done(uint64_t cookie) override;
  bool issue_reads();

  struct Announced { uint64_t addr; uint32_t rkey; uint64_t bytes; uint64_t ready; };
  struct Pull {
    uint64_t msg_id = 0;
    RecvOp* op = nullptr;
    Registration* reg = nullptr;  // of the destination; reg->mr == null: staged through `stage_`
    Announced src{};
    size_t issued = 0, done = 0;
  };
  struct Read { uint64_t pull; size_t offset; uint32_t len; int stage_slot; };
  int peer_;
  std::unique_ptr<Channel> ch_;
  Sink* sink_;  // not owned: the engine, which outlives its connections
  size_t chunk_;
  std::unordered_map<uint64_t, Announced> announced_;
  std::deque<Pull> pulls_;  // in matching order; reads are issued front first
  std::unordered_map<uint64_t, Read> reads_;
  uint64_t next_cookie_ = 1;
  std::unique_ptr<StagingRing> stage_;
  PathStats path_;
};

}  // namespace dicomm::transport::verbs
