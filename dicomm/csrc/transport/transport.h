// The narrow transport interface, modelled on NCCL's net plugin (listen / connect / accept,
// register memory, post send, post receive, progress, close).
//
// Connections are unidirectional in message direction: rank i connects to j for i's sends (a
// SendConn), j accepts (a RecvConn). Feedback the protocol needs (clear-to-send, completion,
// refusal) travels back over the same connection inside the transport.
//
// Unlike NCCL, the receiver does not post buffers blindly: tag matching lives in the engine above,
// so a transport first announces each message (eager payload or a rendezvous announcement) and the
// engine answers a rendezvous with pull() into the matched buffer or refuse(). This is what lets
// MPI-style matching sit above any transport, RDMA verbs included (pull = RDMA read).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/card.h"
#include "core/config.h"
#include "core/handshake.h"

namespace dicomm::transport {

using Clock = std::chrono::steady_clock;

// What the engine says about a message; the transport adds its own framing.
struct Header {
  uint64_t tag = 0;
  uint64_t meta = 0;
  uint64_t bytes = 0;
  uint64_t msg_id = 0;  // assigned by the sending connection, echoed by pull()/refuse()
  // The message's number among the sender's messages to this peer with this tag (the engine's:
  // a receive that timed out names exactly the message it gave up on, core/dispatch.cpp).
  uint32_t tag_seq = 0;
};

// Registered memory (a no-op for shm and tcp; an MR for verbs).
struct MemHandle {
  void* opaque = nullptr;
};

// A send owned by the engine until on_send_done / on_send_refused.
struct SendOp {
  Header hdr;
  const void* buf = nullptr;
  MemHandle mem;
  // In: the engine's flow control wants an announcement only (rendezvous) whatever the size: the
  // receiver has promised no room for more eager bytes. Out: post() sets it for a message it
  // announces. Transports with flow control of their own (Capabilities::own_flow_control) ignore it.
  bool rendezvous = false;
};

// The landing zone of a matched rendezvous message; owned by the engine until on_recv_done.
struct RecvOp {
  void* buf = nullptr;
  size_t bytes = 0;  // message size; the engine has checked that it fits
  MemHandle mem;
};

// Why a receiver refused a rendezvous message; the sender turns it into a MismatchError.
struct Refusal {
  enum Code : uint32_t { kTooSmall = 1, kMetaDiffers = 2, kLate = 3 };  // kLate: its receive timed out
  uint32_t code = 0;
  uint64_t recv_bytes = 0;
  uint64_t recv_meta = 0;
};

class RecvConn;

// Implemented by the engine. Transports call it only from progress()/post()/pull(), with the
// engine lock held; the engine may call pull()/refuse() from inside on_message.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void on_accept(std::shared_ptr<RecvConn> conn) = 0;
  virtual void on_rejected(const std::string& why) = 0;
  // Eager: `payload` holds hdr.bytes bytes, valid during the call only.
  // Rendezvous: payload == nullptr; answer later with pull() or refuse() for hdr.msg_id.
  virtual void on_message(RecvConn& conn, const Header& hdr, const void* payload) = 0;
  virtual void on_send_done(SendOp* op) = 0;
  virtual void on_send_refused(SendOp* op, const Refusal& why) = 0;
  virtual void on_recv_done(RecvOp* op) = 0;
};

class Conn {
 public:
  virtual ~Conn() = default;
  virtual int peer() const = 0;
  virtual const char* transport_name() const = 0;
  // Moves whatever can move without blocking; true if anything happened. `thorough` also reads
  // fds that only carry rare events (doorbells, EOF): a caller spinning on shared memory skips
  // them most of the time, since a syscall per poll would double the latency.
  // Throws PeerError when the connection is broken (peer gone).
  virtual bool progress(bool thorough) = 0;
  // Work that needs the CPU but no fd will signal (a copy in flight): do not sleep.
  virtual bool busy() const = 0;
  // Before sleeping in epoll: ask the peer to ring our doorbell; false if work already waits.
  virtual bool arm() { return !busy(); }
  virtual void disarm() {}
};

class SendConn : public Conn {
 public:
  // Queues (or sends at once) a message; eager or rendezvous is the transport's choice.
  virtual void post(SendOp* op) = 0;
};

class RecvConn : public Conn {
 public:
  // The connecting process as the kernel saw it (shared memory: SO_PEERCRED), 0 when unknown.
  virtual int64_t peer_pid() const { return 0; }
  // The peer's pid where this side may read and write the peer's memory (cross-memory attach, probed
  // when the connection was accepted), else 0.
  virtual int64_t cma_pid() const { return 0; }
  // Gives a matched receive's buffer back to its owner: the rest of the message is read and
  // dropped (or, verbs, no longer read: the reads already posted are awaited), `op` is never
  // completed. False where the transport cannot (shm's sender may be writing into it): its data
  // may still land.
  virtual bool cancel(RecvOp* /*op*/) { return false; }
  virtual void pull(uint64_t msg_id, RecvOp* op) = 0;
  virtual void refuse(uint64_t msg_id, const Refusal& why) = 0;
};

// Everything a transport needs from the engine.
struct Context {
  int rank = 0;
  int size = 0;
  std::string key;  // the handshake key: job token + DICOMM_JOB_SECRET (core/handshake.h)
  Sink* sink = nullptr;            // not owned: the engine, which outlives its transports and connections
  class Poller* poller = nullptr;  // not owned: the engine's poller, destroyed after every transport
  std::chrono::milliseconds handshake_timeout{5000};
  // Not owned: the engine's, which outlives its transports (the defaults for a transport opened alone).
  const EngineConfig* config = &EngineConfig::defaults();
};

// What the engine needs to know about a transport to use it without knowing its name, versioned as
// NCCL's net plugins version their properties: a transport fills the fields of the version it was
// written against; the engine reads only those.
struct Capabilities {
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;
  // Which peers it can ever serve: processes under this kernel only (shared memory, Unix sockets),
  // or any host. A same-kernel connection also tells the engine that its peer runs on this host.
  enum class Reach { kSameKernel, kAnyHost };
  Reach reach = Reach::kAnyHost;
  // Under DICOMM_TRANSPORT=auto a peer gets the reachable transport with the highest preference.
  int preference = 0;
  // Buffers of messages larger than this are registered (register_memory) before a send or a
  // rendezvous receive; the maximum: never.
  size_t register_above = std::numeric_limits<size_t>::max();
  // Whether send and receive buffers may be device (accelerator) pointers.
  bool device_pointers = false;
  // How long a waiter polls this transport's connections itself before it sleeps.
  std::chrono::microseconds spin{100};
  // It has flow control of its own (receive credits): the engine keeps no eager credits for it and
  // never asks it for a rendezvous (SendOp::rendezvous).
  bool own_flow_control = false;
};

class Transport;

// How the engine opens the transports (registry.h): `open` returns null, with `why` set, when this
// host cannot run it (an optional transport: no device, no library); `why` completes the sentence
// "rank 3 has ..." ("no usable RDMA device: ...").
struct TransportFactory {
  std::string name;
  std::string description;  // for messages: "RDMA verbs", "shared-memory"
  // Optional transports are opened only under DICOMM_TRANSPORT=auto or when forced by name; a host
  // without one says why once, and the engine then goes on without it.
  bool optional = false;
  std::unique_ptr<Transport> (*open)(const Context& ctx, std::string* why) = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual const Capabilities& capabilities() const = 0;
  // This rank's address, published in its card under name().
  virtual std::string address() const = 0;
  // Whether this transport can serve `peer` from `self`; if not, `why` says so.
  virtual bool can_reach(const Card& self, const Card& peer, std::string* why) const = 0;
  // Opens a send connection to `peer` (blocking up to `deadline`); throws PeerError.
  virtual std::unique_ptr<SendConn> connect(int peer, const Card& card, Clock::time_point deadline) = 0;
  // Accepts connections and runs handshakes (announced through Sink::on_accept / on_rejected).
  virtual bool progress() = 0;
  virtual MemHandle register_memory(const void* /*buf*/, size_t /*bytes*/) { return {}; }
  virtual void deregister_memory(MemHandle /*mem*/) {}
  // The path one peer's traffic takes, as transport_of() reports it ("verbs/device-direct"...):
  // `send` and `recv` are that peer's connections of this transport (send may be null).
  virtual std::string describe_path(const SendConn* /*send*/,
                                    const std::vector<std::shared_ptr<RecvConn>>& /*recv*/) const {
    return name();
  }
  // Adds this transport's counters to stats(); `paths` holds describe_path() of each peer it serves.
  virtual void add_stats(std::map<std::string, int64_t>& /*out*/, const std::vector<std::string>& /*paths*/) const {}
};

}  // namespace dicomm::transport
