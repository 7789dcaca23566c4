// TCP connections: a send side and a receive side made of several streams. Stream 0 carries the
// frames of every message in order (eager payloads, rendezvous announcements) and, backwards,
// clear-to-send and refusals; data of large messages is striped over all streams in chunks.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transport/tcp/tcp_stream.h"
#include "transport/transport.h"

namespace dicomm::transport::tcp {

constexpr size_t kEagerLimit = 64 * 1024;

class TcpSendConn : public SendConn, private TcpStream::Handler {
 public:
  TcpSendConn(int peer, std::vector<std::unique_ptr<TcpStream>> streams, Sink* sink, size_t chunk_bytes);
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "tcp"; }
  bool progress(bool thorough) override;
  bool busy() const override { return false; }  // socket readiness wakes us
  void post(SendOp* op) override;

 private:
  void on_frame(const Frame& f, const char* payload) override;
  char* data_target(const Frame& f) override;
  void on_data(const Frame&) override {}
  void on_written(const Frame& f, void* cookie) override;

  struct Rendezvous { SendOp* op; size_t chunks_left; bool cleared; };
  int peer_;
  std::vector<std::unique_ptr<TcpStream>> streams_;
  Sink* sink_;  // not owned: the engine, which outlives its connections
  size_t chunk_bytes_;
  uint64_t next_id_ = 1;
  uint64_t next_stream_ = 0;
  std::unordered_map<uint64_t, Rendezvous> rendezvous_;
};

class TcpRecvConn : public RecvConn, private TcpStream::Handler {
 public:
  // peer_pid: the connecting process when it runs on this host (0: unknown).
  TcpRecvConn(int peer, int nstreams, Sink* sink, int64_t peer_pid = 0);
  int64_t peer_pid() const override { return peer_pid_; }
  int peer() const override { return peer_; }
  const char* transport_name() const override { return "tcp"; }
  bool progress(bool thorough) override;
  bool busy() const override { return false; }
  bool cancel(RecvOp* op) override;
  void pull(uint64_t msg_id, RecvOp* op) override;
  void refuse(uint64_t msg_id, const Refusal& why) override;

  int nstreams() const { return static_cast<int>(streams_.size()); }
  // False if that stream index is taken already.
  bool attach(int index, std::unique_ptr<TcpStream> stream);

 private:
  void on_frame(const Frame& f, const char* payload) override;
  char* data_target(const Frame& f) override;
  void on_data(const Frame& f) override;
  void on_written(const Frame&, void*) override {}

  std::string who() const { return "tcp connection from rank " + std::to_string(peer_); }
  // claimed: bytes of data frames whose header was read; landed: of those fully read.
  struct Landing { RecvOp* op; size_t claimed; size_t landed; size_t bytes; bool discard; };
  int peer_;
  int64_t peer_pid_;
  int reading_ = 0;  // the stream being read (frames other than data belong on stream 0)
  std::vector<std::unique_ptr<TcpStream>> streams_;
  Sink* sink_;  // not owned: the engine, which outlives its connections
  std::unordered_map<uint64_t, Landing> landing_;
  std::unordered_set<uint64_t> announced_;  // rendezvous ids not yet answered (pull or refuse)
};

}  // namespace dicomm::transport::tcp
