#include "streams.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <deque>
#include <mutex>
#include <utility>

#include "runtime.h"

namespace diopi_bindings {

namespace {

constexpr size_t kMaxDevices = 64;

struct DeviceStreams {
  std::array<void*, kPoolSize + 1> handles{};  // [0] default, then the pool
  std::atomic<uint32_t> next{0};
};

std::mutex g_mutex;  // guards stream creation and the pending copies
std::array<DeviceStreams, kMaxDevices> g_streams;
thread_local std::array<c10::StreamId, kMaxDevices> t_current{};

// Host memory of async copies still queued: dropped once their event completed.
struct Pending {
  c10::Storage keep;
  Event event;
};
std::deque<Pending> g_pending;

void check_id(c10::DeviceIndex device, c10::StreamId id) {
  check_index(device);
  TORCH_CHECK(id >= 0 && id <= kPoolSize, "diopi: stream id ", id, " is not a stream of the diopi device ",
              static_cast<int>(device), " (ids 0 to ", kPoolSize, ")");
}

// Releases the host memory of the async copies whose event completed (the oldest first).
void prune_pending() {
  std::deque<Pending> done;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    while (!g_pending.empty()) {
      int32_t complete = 0;
      const Event& e = g_pending.front().event;
      check(runtime().event_query(e.device, e.handle, &complete), "diopi_event_query");
      if (!complete) break;
      done.push_back(std::move(g_pending.front()));
      g_pending.pop_front();
    }
  }
  for (Pending& p : done) (void)runtime().event_destroy(p.event.device, p.event.handle);
}

void queue_copy(c10::DeviceIndex device, c10::Storage keep,
                diopiError_t (*copy)(int32_t, void*, const void*, int64_t, void*), void* dst, const void* src,
                int64_t nbytes, const char* name) {
  prune_pending();
  const c10::StreamId id = current_stream_id(device);
  void* stream = stream_handle(device, id);
  check(copy(device, dst, src, nbytes, stream), name);
  Event event{device, nullptr};
  check(runtime().event_create(device, &event.handle), "diopi_event_create");
  check(runtime().event_record(device, event.handle, stream), "diopi_event_record");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pending.push_back({std::move(keep), event});
}

}  // namespace

bool has_streams() noexcept { return attached() && runtime().stream_create != nullptr; }

void* stream_handle(c10::DeviceIndex device, c10::StreamId id) {
  if (!has_streams()) return nullptr;
  check_id(device, id);
  DeviceStreams& streams = g_streams[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(g_mutex);
  void*& handle = streams.handles[static_cast<size_t>(id)];
  if (handle == nullptr) check(runtime().stream_create(device, &handle), "diopi_stream_create");
  return handle;
}

c10::StreamId current_stream_id(c10::DeviceIndex device) noexcept {
  return device >= 0 && static_cast<size_t>(device) < kMaxDevices ? t_current[static_cast<size_t>(device)] : 0;
}

void set_current_stream_id(c10::DeviceIndex device, c10::StreamId id) {
  check_id(device, id);
  TORCH_CHECK(id == 0 || has_streams(), "diopi: the library has no streams (diopi_stream_create): only stream 0");
  t_current[static_cast<size_t>(device)] = id;
}

c10::StreamId next_pool_stream(c10::DeviceIndex device) {
  check_index(device);
  if (!has_streams()) return 0;
  return 1 + static_cast<c10::StreamId>(g_streams[static_cast<size_t>(device)].next.fetch_add(1) % kPoolSize);
}

void synchronize_stream(c10::DeviceIndex device, c10::StreamId id) {
  if (!has_streams()) return;
  check(runtime().stream_synchronize(device, stream_handle(device, id)), "diopi_stream_synchronize");
  prune_pending();
}

bool query_stream(c10::DeviceIndex device, c10::StreamId id) {
  if (!has_streams()) return true;
  int32_t done = 0;
  check(runtime().stream_query(device, stream_handle(device, id), &done), "diopi_stream_query");
  return done != 0;
}

void synchronize_current_stream(c10::DeviceIndex device) {
  if (has_streams()) synchronize_stream(device, current_stream_id(device));
}

void record_event(void** event, c10::DeviceIndex device, c10::StreamId stream) {
  if (!has_streams()) {  // the work is complete already
    *event = nullptr;
    return;
  }
  auto* e = static_cast<Event*>(*event);
  if (e == nullptr) {
    e = new Event{device, nullptr};
    const diopiError_t code = runtime().event_create(device, &e->handle);
    if (code != DIOPI_SUCCESS) delete e;
    check(code, "diopi_event_create");
    *event = e;
  }
  TORCH_CHECK(e->device == device, "diopi: an event of device ", static_cast<int>(e->device),
              " recorded on a stream of device ", static_cast<int>(device));
  check(runtime().event_record(device, e->handle, stream_handle(device, stream)), "diopi_event_record");
}

void wait_event(void* event, c10::DeviceIndex device, c10::StreamId stream) {
  if (event == nullptr) return;  // never recorded, or recorded complete
  const auto* e = static_cast<Event*>(event);
  check(runtime().stream_wait_event(device, stream_handle(device, stream), e->handle), "diopi_stream_wait_event");
}

bool query_event(void* event) {
  if (event == nullptr) return true;
  const auto* e = static_cast<Event*>(event);
  int32_t done = 0;
  check(runtime().event_query(e->device, e->handle, &done), "diopi_event_query");
  return done != 0;
}

void synchronize_event(void* event) {
  if (event == nullptr) return;
  const auto* e = static_cast<Event*>(event);
  check(runtime().event_synchronize(e->device, e->handle), "diopi_event_synchronize");
}

void destroy_event(void* event) noexcept {
  auto* e = static_cast<Event*>(event);
  if (e == nullptr) return;
  if (attached()) (void)runtime().event_destroy(e->device, e->handle);
  delete e;
}

void copy_h2d_async(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes, c10::Storage keep) {
  queue_copy(device, std::move(keep), runtime().memcpy_h2d_async, dst, src, nbytes, "diopi_memcpy_h2d_async");
}

void copy_d2h_async(c10::DeviceIndex device, void* dst, const void* src, int64_t nbytes, c10::Storage keep) {
  queue_copy(device, std::move(keep), runtime().memcpy_d2h_async, dst, src, nbytes, "diopi_memcpy_d2h_async");
}

}  // namespace diopi_bindings
