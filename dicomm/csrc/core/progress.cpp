// Who moves data: a caller waiting on a request polls the connections itself for a short while
// (a ping-pong then never pays a thread hand-off), then blocks and leaves the work to the
// progress thread, which sleeps in epoll whenever nothing moves. The engine lock makes sure one
// thread at a time progresses the connections.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sched.h>
#include <sys/sysinfo.h>
#include <thread>

#include "core/engine.h"
#include "core/log.h"
#include "transport/socket.h"

namespace dicomm {
namespace {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spinning callers look at sockets (EOF, accepts) every DICOMM_SPIN_THOROUGH_EVERY polls (a system
// call) and pause DICOMM_SPIN_PAUSES times between polls: none by default, since under QEMU TCG each
// pause leaves the emulated CPU's loop (8 B over Soft-RoCE: 16.5 us median half round trip without,
// 17.7 us with 4; natively over shm no difference was measurable).
// Giving the CPU away (sched_yield) is what lets a peer sharing our CPU run, and pure cost when every
// rank has a CPU of its own: 8 B over Soft-RoCE, paired A/B, never yielding against yielding every 8th
// poll: -0.25 to -1.69 us per half round trip (5 of 5 process pairs; a pair's own noise is ~0.3 us),
// against every 64th: -0.08 to -0.54. So, as Open MPI does with yield_when_idle, a spinner yields only
// when this host's ranks outnumber its CPUs; DICOMM_SPIN_YIELD_EVERY (polls; 0 never) overrides.
constexpr int kYieldEveryOversubscribed = 8;
// The ranks on this host by the launcher's word (torchrun's LOCAL_WORLD_SIZE, not a dicomm setting),
// 0 when it says nothing.
int launcher_local_ranks() {
  static const int n = [] {
    const char* v = std::getenv("LOCAL_WORLD_SIZE");
    return v ? std::max(0, std::atoi(v)) : 0;
  }();
  return n;
}
// A spinning caller reads the clock (spin budget, deadline) every 8th pass: under QEMU TCG a read
// is a good part of a pass (8 B over Soft-RoCE, paired A/B: 0.16-0.64 us less per half round trip).
constexpr int kClockEvery = 8;
constexpr int kSleepMs = 100;       // the progress thread's longest sleep (handshake deadlines)
// The progress thread takes over only once callers have stopped driving for this long: waking it
// at the end of every wait made it fight the next wait of a ping-pong for the lock and the CPU
// (under QEMU TCG, 8 B over verbs: ~3 involuntary context switches of the caller per round trip).
constexpr auto kTakeOver = std::chrono::milliseconds(5);

// Whether this host has more runnable tasks than CPUs (/proc/loadavg's running count, read at most
// every 20 ms; DICOMM_SPIN_CONTENTION=0 never looks). Then a spinning waiter only takes the CPU
// from the peer it waits for, and blocking in epoll at once wins: 8 B over shm with a busy process
// per CPU (dicomm-bench p2p --contention 1, 2-core VM) took 129.6 us (median) spinning, 14.7 us
// blocking, gloo 31-37 us. Yielding instead was worse still (3.3 ms): the hogs take the slices.
bool host_contended(bool enabled) {
  static const int cpus = std::max(1, get_nprocs());
  static std::atomic<Clock::rep> checked_at{0};
  static std::atomic<bool> contended{false};
  if (!enabled) return false;
  const Clock::rep now = Clock::now().time_since_epoch().count();
  if (now - checked_at.load(std::memory_order_relaxed) <
      std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(20)).count())
    return contended.load(std::memory_order_relaxed);
  checked_at.store(now, std::memory_order_relaxed);
  int running = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%*f %*f %*f %d/", &running) != 1) running = 0;
    std::fclose(f);
  }
  contended.store(running > cpus, std::memory_order_relaxed);
  return running > cpus;
}

}  // namespace

bool Engine::progress_locked(bool thorough) {
  bool did = false;
  if (thorough) {
    for (auto& t : transports_) did |= t->progress();
    did |= check_processes_locked();
  }
  for (int peer = 0; peer < size_; ++peer) {
    Peer& p = peers_[peer];
    if (p.dead) continue;
    if (p.closed_awaiting_until != transport::Clock::time_point{} &&
        (!p.recv.empty() || transport::Clock::now() >= p.closed_awaiting_until)) {
      p.closed_awaiting_until = {};
      const std::string why = p.dead_reason;
      if (p.recv.empty()) peer_lost(peer, why);
      else send_side_closed(peer, why);
      did = true;
      if (p.dead) continue;
    }
    try {
      if (p.send) did |= p.send->progress(thorough);
    } catch (const transport::ConnectionClosed& e) {
      // The peer closed in order: its messages to us may still be draining on our receive side.
      // A peer that aborts connects to us to say why just before it closes: if that connection
      // is not accepted yet, its handshake gets 200 ms, decided by later passes (above) so that
      // nothing waits for it under the engine lock. Meanwhile nothing more is sent to it.
      if (p.recv.empty()) {
        p.closed_awaiting_until = transport::Clock::now() + std::chrono::milliseconds(200);
        p.send_closed = true;
        p.dead_reason = e.what();
        graveyard_.push_back(std::move(p.send));
      } else {
        send_side_closed(peer, e.what());
      }
      did = true;
    } catch (const PeerError& e) {
      peer_failed(peer, e);
      did = true;
    }
    try {
      for (size_t i = 0; i < p.recv.size(); ++i) did |= p.recv[i]->progress(thorough);
    } catch (const PeerError& e) {
      // The peer may have taken our last message and closed between our send pass and this one:
      // collect the send side's completions before failing what is still pending.
      try {
        if (p.send) p.send->progress(false);
      } catch (const std::exception&) {
      }
      peer_failed(peer, e);
      did = true;
    }
  }
  if (credits_due_) return_credits_locked();
  apply_abort_notice_locked();
  graveyard_.clear();
  return did;
}

bool Engine::arm_locked() {
  bool ok = true;
  for (auto& p : peers_) {
    if (p.dead) continue;
    if (p.send) ok &= p.send->arm();
    for (auto& c : p.recv) ok &= c->arm();
  }
  if (!ok) disarm_locked();
  return ok;
}

void Engine::disarm_locked() {
  for (auto& p : peers_) {
    if (p.send) p.send->disarm();
    for (auto& c : p.recv) c->disarm();
  }
}

void Engine::note_local_locked(Peer& p) {
  if (p.local) return;
  p.local = true;
  ++local_ranks_;
}

int Engine::spin_yield_every_locked() const {
  if (config_.spin_yield_every >= 0) return config_.spin_yield_every;
  return std::max(local_ranks_, launcher_local_ranks()) > cpus_ ? kYieldEveryOversubscribed : 0;
}

void Engine::set_transport_locked(Peer& p, transport::Transport& t) {
  p.transport = &t;
  p.spin = t.capabilities().spin;
  p.register_above = t.capabilities().register_above;
  p.credited = !t.capabilities().own_flow_control;
}

std::chrono::microseconds Engine::spin_budget_locked(const P2PRequest& r) const {
  auto of = [&](const Peer& p) { return p.transport ? p.spin : config_.spin; };
  if (r.peer == rank_) return config_.spin;
  if (r.peer != kAnySource) return of(peers_[r.peer]);
  auto most = std::chrono::microseconds(0);
  for (const auto& p : peers_) most = std::max(most, of(p));
  return most;
}

void Engine::poke() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (lock.owns_lock() && !closed_) progress_locked(false);
}

void Engine::wait(P2PRequest& r, std::chrono::milliseconds timeout, const std::function<bool()>* give_up) {
  if (r.done()) {  // an eager send is done before its wait: no clock, no lock
    r.rethrow_if_failed();
    return;
  }
  // A batch's wait for one request ends at the first failure of another (which wakes us as any
  // failure does): the batch has failed, whatever this request would still do.
  auto settled = [&] { return r.done() || (give_up && (*give_up)()); };
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Spin: poll the transports ourselves (giving the CPU away only on an oversubscribed host). Over TCP
  // only a short spin pays (an 8 B half round-trip measured 25-26 us with 30-80 us of spin, 32-59 us
  // without): a reply usually lands within one loopback round trip, later ones are better met in epoll.
  // Each clock read and lock is a good part of a pass under QEMU TCG: the spin's setup shares the
  // first pass's lock, and `last` (the latest reading) dates the end of driving (paired A/B, 8 B over
  // Soft-RoCE, with the early return above: -1.0 and -1.5 us per half round trip).
  auto spin_end = start, last = start;
  int yield_every = 0;
  for (int i = 1;; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (i == 1) {
        if (host_contended(config_.spin_contention)) ++counters_.waits_unspun;
        else spin_end += spin_budget_locked(r);
        yield_every = spin_yield_every_locked();
        ++driving_;
        disarm_locked();
      }
      if (closed_) break;
      progress_locked(i % config_.spin_thorough_every == 0);
    }
    if (settled()) break;
    if (i % kClockEvery == 0) {
      last = Clock::now();
      if (last >= spin_end || last >= deadline) break;
    }
    if (yield_every > 0 && i % yield_every == 0) sched_yield();
    else for (int k = 0; k < config_.spin_pauses; ++k) cpu_relax();
  }
  // No notify: the progress thread looks within kTakeOver, a scale on which `last` (at most
  // kClockEvery passes old) is now.
  stop_driving(last);
  if (settled()) {  // the usual end of a spin: no second lock
    r.rethrow_if_failed();
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Block. One waiting caller sleeps in epoll itself, so the wake-up lands where the result is
  // wanted (no hand-off through the progress thread); other waiters sleep on the condition.
  while (!settled()) {
    auto now = Clock::now();
    if (now >= deadline) time_out(r, timeout);
    if (!closed_ && !arm_locked()) {  // work is waiting: do it rather than sleep
      progress_locked(true);
      continue;
    }
    auto until = std::min(deadline, now + std::chrono::milliseconds(kSleepMs));
    if (!caller_polling_ && !closed_) {
      caller_polling_ = true;
      ++driving_;
      lock.unlock();
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
      sleep_in_poller(static_cast<int>(ms));
      lock.lock();
      caller_polling_ = false;
      stop_driving(Clock::now());
      disarm_locked();
      if (!closed_) progress_locked(true);
      if (blocked_) done_cv_.notify_all();  // let another waiter take over the polling
      continue;
    }
    ++blocked_;
    done_cv_.wait_until(lock, until);
    --blocked_;
  }
  r.rethrow_if_failed();
}

bool Engine::cancel_matched_locked(P2PRequest& r) {
  if (r.matched_from < 0 || r.matched_from == rank_) return false;
  for (auto& c : peers_[r.matched_from].recv) {
    if (!c->cancel(&r.recv_op)) continue;
    take_in_flight(&r.recv_op);
    release_memory(r);
    return true;
  }
  return false;
}

void Engine::time_out(P2PRequest& r, std::chrono::milliseconds timeout) {
  std::string state;
  if (r.op == P2PRequest::Op::kRecv) {
    const size_t ahead = r.peer != kAnySource ? queues_.posted_ahead(&r) : 0;
    // Behind an any-source receive with the same tag, the message r would take depends on what
    // that one takes first (from any rank): r's place stays in the queue, and the message that
    // reaches it is discarded. An any-source receive claims no message at all (it served
    // whichever sender came first): a later message goes to the next receive that accepts it.
    // A receive from this rank itself claims nothing either: a send to itself is matched the moment
    // it is posted, so no message was on its way, and whatever is sent later is not late.
    const bool claims = r.peer != kAnySource && r.peer != rank_;
    auto place = std::make_shared<P2PRequest>(nullptr, P2PRequest::Op::kRecv, r.peer, r.tag, 0, nullptr, 0);
    place->withdrawn = true;
    const bool behind_any_source = claims && queues_.any_source_ahead(&r);
    if (behind_any_source ? queues_.replace_posted(&r, place) : queues_.remove_posted(&r)) {
      state = "no matching message arrived; the receive is cancelled";
      if (claims && !behind_any_source) give_up_locked(r, ahead);  // its message is discarded
      r.fail(ErrorKind::kTimeout, r.describe() + " timed out earlier (" + state + ")");
    } else if (cancel_matched_locked(r)) {
      state = "matched a message from rank " + std::to_string(r.matched_from) +
              " but its data did not arrive in time; the receive is cancelled and the buffer is never written again";
      r.fail(ErrorKind::kTimeout, r.describe() + " timed out earlier (" + state + ")");
    } else {
      state = "matched a message from rank " + std::to_string(r.matched_from) +
              " but its data did not arrive in time (it may still land: the transport could not stop it)";
    }
  } else {
    state = "the receiver has not taken the message yet";
  }
  throw TimeoutError("Timed out after " + std::to_string(timeout.count()) + " ms waiting for " + r.describe() + ": " +
                     state);
}

// A held connection (connections.cpp) is not read, so its descriptor may stay readable: while
// there is one, sleep in steps of a millisecond rather than spin on epoll.
void Engine::sleep_in_poller(int ms) {
  if (held_.load() == 0) {
    poller_->wait(ms);
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, 1)));
}

void Engine::progress_loop() {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  for (;;) {
    try {
      if (!lock.owns_lock()) lock.lock();
      progress_loop_locked(lock);
      return;
    } catch (const std::exception& e) {
      // Nothing may escape a thread: fail the communicator loudly instead of terminating.
      if (!lock.owns_lock()) lock.lock();
      log(LogLevel::kError, "rank " + std::to_string(rank_) + " progress thread: " + e.what());
      if (!closed_) {
        closed_ = true;
        abort_reason_ = std::string("internal error in the progress thread: ") + e.what();
        fail_everything(abort_reason_);
      }
      done_cv_.notify_all();
      idle_cv_.wait(lock, [&] { return stop_; });  // close() ends the thread
      return;
    }
  }
}

void Engine::progress_loop_locked(std::unique_lock<std::mutex>& lock) {
  while (!stop_) {
    if (driving_ > 0 || Clock::now() - driven_at() < kTakeOver) {  // callers drive: stay out of their way
      idle_cv_.wait_for(lock, kTakeOver);
      continue;
    }
    if (progress_locked(true)) {
      lock.unlock();
      sched_yield();  // let callers take the lock between passes
      lock.lock();
      continue;
    }
    if (!arm_locked()) continue;
    lock.unlock();
    sleep_in_poller(kSleepMs);
    lock.lock();
    if (driving_ == 0) disarm_locked();
  }
}

}  // namespace dicomm
