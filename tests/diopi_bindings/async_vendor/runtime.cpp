// The runtime half of the asynchronous test vendor, against the project's own ABI (diopi/diopirt.h):
// device memory (host memory, blocks tracked), streams served by worker threads, events as points on a
// stream, async copies queued. Synchronous copies do not wait for the streams (as a real device's would
// not for other streams): the framework must synchronize the stream first.
#include <diopi/diopirt.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "stream_queue.h"

namespace {

// Never destroyed: the workers wait on them until the process ends (a condition variable destroyed under
// its waiters blocks the exit).
std::mutex& g_mutex = *new std::mutex();  // blocks, streams' queues, counters
std::condition_variable& g_cv = *new std::condition_variable();
std::map<uintptr_t, int64_t> g_blocks;
bool g_hold = false;
int64_t g_ran_on_worker = 0;   // work items run by a worker thread
int64_t g_queued_total = 0;
thread_local const char* t_error = "";

struct Stream {
  std::deque<std::function<void()>> queue;
  uint64_t queued = 0, done = 0;
  int draining = 0;  // synchronizers waiting: they lift the hold for this stream
  bool stop = false;
  std::thread worker;
};
std::vector<Stream*> g_streams;

void run(Stream* s) {
  std::unique_lock<std::mutex> lock(g_mutex);
  for (;;) {
    g_cv.wait(lock, [&] { return s->stop || (!s->queue.empty() && (!g_hold || s->draining > 0)); });
    if (s->stop && s->queue.empty()) return;
    std::function<void()> work = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a kernel that takes a while
    work();
    lock.lock();
    ++s->done;
    ++g_ran_on_worker;
    g_cv.notify_all();
  }
}

// Waits until the stream has run `target` items (synchronizing lifts the hold for it meanwhile).
void wait_for(Stream* s, uint64_t target) {
  std::unique_lock<std::mutex> lock(g_mutex);
  ++s->draining;
  g_cv.notify_all();
  g_cv.wait(lock, [&] { return s->done >= target; });
  --s->draining;
}

struct Event {
  Stream* stream = nullptr;
  uint64_t target = 0;
};

diopiError_t invalid(const char* message) {
  t_error = message;
  return DIOPI_ERR_INVALID_ARGUMENT;
}

}  // namespace

namespace asyncvendor {

void enqueue(void* stream, std::function<void()> work) {
  auto* s = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  s->queue.push_back(std::move(work));
  ++s->queued;
  ++g_queued_total;
  g_cv.notify_all();
}

bool is_device_memory(const void* ptr, int64_t nbytes) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_blocks.upper_bound(addr);
  if (it == g_blocks.begin()) return false;
  --it;
  return addr + static_cast<uint64_t>(nbytes) <= it->first + static_cast<uint64_t>(it->second);
}

}  // namespace asyncvendor

extern "C" {

uint32_t diopi_abi_version(void) { return DIOPI_ABI_VERSION; }
const char* diopi_vendor_name(void) { return "async-test-vendor"; }
const char* diopi_impl_version(void) { return "0.1"; }
const char* diopi_last_error(void) { return t_error; }

diopiError_t diopi_device_count(int32_t* count) {
  *count = 1;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_set_device(int32_t device) { return device == 0 ? DIOPI_SUCCESS : invalid("one device"); }
diopiError_t diopi_get_device(int32_t* device) {
  *device = 0;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_device_malloc(int32_t device, int64_t nbytes, void** ptr) {
  *ptr = ::operator new(static_cast<size_t>(nbytes > 0 ? nbytes : 1));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_blocks[reinterpret_cast<uintptr_t>(*ptr)] = nbytes;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_device_free(int32_t device, void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_blocks.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return invalid("free of memory not allocated here");
  ::operator delete(ptr);
  return DIOPI_SUCCESS;
}
diopiError_t diopi_memcpy_h2d(int32_t, void* dst, const void* src, int64_t n) {
  std::memmove(dst, src, static_cast<size_t>(n));
  return DIOPI_SUCCESS;
}
diopiError_t diopi_memcpy_d2h(int32_t, void* dst, const void* src, int64_t n) {
  std::memmove(dst, src, static_cast<size_t>(n));
  return DIOPI_SUCCESS;
}
diopiError_t diopi_memcpy_d2d(int32_t, void* dst, int32_t, const void* src, int64_t n) {
  std::memmove(dst, src, static_cast<size_t>(n));
  return DIOPI_SUCCESS;
}
diopiError_t diopi_device_synchronize(int32_t) {
  std::vector<std::pair<Stream*, uint64_t>> targets;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (Stream* s : g_streams) targets.emplace_back(s, s->queued);
  }
  for (auto& [s, target] : targets) wait_for(s, target);
  return DIOPI_SUCCESS;
}

diopiError_t diopi_stream_create(int32_t, void** stream) {
  auto* s = new Stream();
  s->worker = std::thread(run, s);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_streams.push_back(s);
  *stream = s;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_stream_destroy(int32_t, void*) { return DIOPI_SUCCESS; }  // workers live with the process
diopiError_t diopi_stream_synchronize(int32_t, void* stream) {
  auto* s = static_cast<Stream*>(stream);
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    target = s->queued;
  }
  wait_for(s, target);
  return DIOPI_SUCCESS;
}
diopiError_t diopi_stream_query(int32_t, void* stream, int32_t* done) {
  auto* s = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  *done = s->done >= s->queued ? 1 : 0;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_memcpy_h2d_async(int32_t, void* dst, const void* src, int64_t n, void* stream) {
  asyncvendor::enqueue(stream, [=] { std::memmove(dst, src, static_cast<size_t>(n)); });
  return DIOPI_SUCCESS;
}
diopiError_t diopi_memcpy_d2h_async(int32_t, void* dst, const void* src, int64_t n, void* stream) {
  asyncvendor::enqueue(stream, [=] { std::memmove(dst, src, static_cast<size_t>(n)); });
  return DIOPI_SUCCESS;
}
diopiError_t diopi_event_create(int32_t, void** event) {
  *event = new Event();
  return DIOPI_SUCCESS;
}
diopiError_t diopi_event_destroy(int32_t, void* event) {
  delete static_cast<Event*>(event);
  return DIOPI_SUCCESS;
}
diopiError_t diopi_event_record(int32_t, void* event, void* stream) {
  auto* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(g_mutex);
  e->stream = static_cast<Stream*>(stream);
  e->target = e->stream->queued;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_event_query(int32_t, void* event, int32_t* done) {
  auto* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(g_mutex);
  *done = e->stream == nullptr || e->stream->done >= e->target ? 1 : 0;
  return DIOPI_SUCCESS;
}
diopiError_t diopi_event_synchronize(int32_t, void* event) {
  auto* e = static_cast<Event*>(event);
  if (e->stream != nullptr) wait_for(e->stream, e->target);
  return DIOPI_SUCCESS;
}
diopiError_t diopi_stream_wait_event(int32_t, void* stream, void* event) {
  const Event e = *static_cast<Event*>(event);
  if (e.stream != nullptr) asyncvendor::enqueue(stream, [e] { wait_for(e.stream, e.target); });
  return DIOPI_SUCCESS;
}

// Test controls (not DIOPI): hold the workers, and how much work ran on them.
void asyncvendor_hold(int32_t on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_hold = on != 0;
  g_cv.notify_all();
}
int64_t asyncvendor_ran_on_worker(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_ran_on_worker;
}
int64_t asyncvendor_queued(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_queued_total;
}

}  // extern "C"
