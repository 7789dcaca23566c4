#include "core/communicator.h"

#include "collectives/executor.h"
#include "collectives/work_stealing.h"
#include "core/engine.h"

namespace dicomm {
namespace {

// The collective executor's requests do not know the communicator's timeout; this wrapper does,
// so `wait(None)` from Python means the same for collectives as for point-to-point.
class CollectiveHandle : public Request, public HasDefaultTimeout {
 public:
  CollectiveHandle(RequestPtr inner, std::chrono::milliseconds timeout) : inner_(std::move(inner)), timeout_(timeout) {}
  bool test() override { return inner_->test(); }
  void wait(std::chrono::milliseconds timeout) override { inner_->wait(timeout); }
  bool has_failed() const override { return inner_->has_failed(); }
  void wait_unless(std::chrono::milliseconds timeout, const std::function<bool()>& give_up) override {
    inner_->wait_unless(timeout, give_up);
  }
  int source() const override { return inner_->source(); }
  size_t nbytes() const override { return inner_->nbytes(); }
  std::string describe() const override { return inner_->describe(); }
  // A little past the collective's own deadline, so that its error (which names the peer and the
  // step that never answered) is what the caller sees rather than a bare timeout of the wait.
  std::chrono::milliseconds default_timeout() const override { return timeout_ + timeout_ / 10 + std::chrono::milliseconds(500); }

 private:
  RequestPtr inner_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const Options& options) {
  if (size < 1) throw ValueError("communicator size must be at least 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    throw ValueError("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(size - 1));
  if (!store) throw ValueError("communicator needs a store for bootstrap");
  if (options.timeout.count() <= 0) throw ValueError("communicator timeout must be positive");
  engine_ = std::make_shared<Engine>(std::move(store), rank, size, options);
  engine_->start();
  // A collective stuck connecting (a peer's address card not in the store) says so when it times out.
  collectives_ = std::make_unique<CollectiveExecutor>([engine = std::weak_ptr<Engine>(engine_)] {
    auto e = engine.lock();
    return e ? e->awaited_cards() : std::string();
  });
  work_stealing_ = std::make_unique<WorkStealing>();
}

Communicator::~Communicator() {
  close();
  collectives_.reset();  // joins the collective thread; its waits have failed already
}

int Communicator::rank() const { return engine_->rank(); }
int Communicator::size() const { return engine_->size(); }
std::chrono::milliseconds Communicator::timeout() const { return engine_->timeout(); }
const EngineConfig& Communicator::config() const { return engine_->config(); }

RequestPtr Communicator::isend(const void* buf, size_t bytes, int peer, Tag tag, uint64_t meta) {
  return engine_->isend(buf, bytes, peer, tag, meta);
}

RequestPtr Communicator::irecv(void* buf, size_t bytes, int peer, Tag tag, uint64_t meta) {
  return engine_->irecv(buf, bytes, peer, tag, meta);
}

std::string Communicator::transport_of(int peer) const { return engine_->transport_of(peer); }
int64_t Communicator::cma_pid(int peer) const { return engine_->cma_pid(peer); }
std::map<std::string, int64_t> Communicator::stats() const {
  auto out = engine_->stats();
  out["all_reduce_chunks_stolen"] = work_stealing_->chunks_stolen.load();
  return out;
}

void Communicator::abort(const std::string& reason) { abort_with(reason, ErrorKind::kPeer); }
void Communicator::abort_with(const std::string& reason, ErrorKind kind, uint64_t collective_seq) {
  engine_->abort("communicator aborted: " + reason, kind, /*tell_peers=*/true, collective_seq);
}

void Communicator::close() {
  if (closed_.exchange(true)) return;
  // Point-to-point first so a running collective's waits end, then the collective thread.
  engine_->abort("communicator closed", ErrorKind::kPeer, /*tell_peers=*/false);
  if (collectives_) collectives_->shutdown("communicator closed");
  engine_->close();
}

RequestPtr Communicator::submit_collective(const std::string& what, std::function<void(uint64_t seq)> body) {
  uint64_t seq = next_collective_seq_.fetch_add(1);
  return std::make_shared<CollectiveHandle>(collectives_->submit(what, std::move(body), seq),
                                            engine_->timeout());
}

}  // namespace dicomm
