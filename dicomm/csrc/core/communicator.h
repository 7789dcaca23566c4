// The communicator: rank `rank` of `size` peers, asynchronous tag-matched point-to-point on raw
// buffers, and the collective executor that serialises collectives on their own thread.
//
// CONTRACT shared by the engine (core/, transport/), the collectives (collectives/) and the Python
// bindings (python/). The public members below are the interface; private members belong to the
// engine and may change freely.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/request.h"
#include "core/store.h"
#include "core/types.h"

namespace dicomm {

class CollectiveExecutor;  // collectives/executor.h
class WorkStealing;        // collectives/work_stealing.h
class Engine;              // the engine's private state (core/)
struct EngineConfig;       // core/config.h

struct Options {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string transport = "auto";  // auto | shm | tcp   (DICOMM_TRANSPORT overrides when set)
  // Knobs of docs/dicomm-config.md for this communicator alone, by variable name; the environment
  // overrides them (core/config.h).
  std::map<std::string, std::string> settings;
};

class Communicator {
 public:
  // Publishes this rank's address card in `store`; peers connect lazily on first use.
  Communicator(std::shared_ptr<Store> store, int rank, int size, const Options& options);
  ~Communicator();  // stops the collective executor first, then the engine
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  std::chrono::milliseconds timeout() const;
  // The settings it was created with (options, then the environment): collectives read theirs here.
  const EngineConfig& config() const;

  // Point-to-point. Messages between one pair with one tag never overtake each other.
  // A receive whose buffer is smaller than the message fails with MismatchError (nothing is
  // truncated); a smaller message completes with nbytes() < bytes. `peer` may be kAnySource for
  // receives. A non-zero `meta` on a receive must equal the sender's meta, or both fail with
  // MismatchError whose text shows both metas through `describe_meta`.
  RequestPtr isend(const void* buf, size_t bytes, int peer, Tag tag, uint64_t meta = 0);
  RequestPtr irecv(void* buf, size_t bytes, int peer, Tag tag, uint64_t meta = 0);

  // Transport serving `peer`: "self", "shm", "tcp" (later "verbs"), or "" before first contact.
  std::string transport_of(int peer) const;
  // The pid of `peer`'s process when every connection it opened to this rank so far is shared memory
  // whose sender's memory this rank may read and write (cross-memory attach); -1 before it opened one,
  // 0 otherwise. The pid is the kernel's (SO_PEERCRED), not one the peer claimed.
  int64_t cma_pid(int peer) const;
  // Counters: "rejected_connections", "connections", bytes sent/received, ..., and the collectives'
  // "all_reduce_chunks_stolen".
  std::map<std::string, int64_t> stats() const;

  // Fails every pending request with PeerError(reason); later calls fail immediately. The peers are
  // told (an abort notice on each connection), so their pending requests fail too, naming this
  // rank and the reason, with the error class of `kind` (a mismatch stays a MismatchError).
  void abort(const std::string& reason);
  // `collective_seq`: the collective that failed (its requests on every rank fail with `kind`;
  // other requests with PeerError), or kNoCollective.
  static constexpr uint64_t kNoCollective = ~uint64_t{0};
  void abort_with(const std::string& reason, ErrorKind kind, uint64_t collective_seq = kNoCollective);
  // Orderly shutdown (idempotent); pending requests fail with PeerError("communicator closed").
  void close();

  // Collectives: runs `body` on the collective thread, in submission order (all ranks submit
  // collectives in the same order). The returned request completes when `body` returns and fails
  // with whatever it throws. `what` describes the op for error messages ("all_reduce 4096 x float32").
  RequestPtr submit_collective(const std::string& what, std::function<void(uint64_t seq)> body);
  // Turns a meta word into text for error messages (set by the collectives layer).
  static std::function<std::string(uint64_t)> describe_meta;
  // What the push all_reduce keeps between calls (its claim words); used on the collective thread.
  WorkStealing& work_stealing() { return *work_stealing_; }

 private:
  std::shared_ptr<Engine> engine_;  // shared: requests keep it alive after the communicator is gone
  std::unique_ptr<CollectiveExecutor> collectives_;
  std::unique_ptr<WorkStealing> work_stealing_;
  std::atomic<uint64_t> next_collective_seq_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace dicomm
