// Device memory from the library, through a caching allocator: a vendor's device malloc is slow (it may
// synchronize the device), so a freed block goes to a per-device free list keyed by its rounded size and
// the next allocation of that size takes it back without calling the library. A block returns to the
// list only when torch drops the last reference to its storage (the DataPtr's deleter), so memory still
// referenced is never handed out. Streams, as CUDA's caching allocator has them: a block belongs to the stream
// it was allocated on and is cached for that stream only (work on one stream runs in the order it was
// queued, so what reuses the block there runs after whatever used it); Tensor.record_stream(s) adds a stream
// that uses the block, and when such a block is freed an event is recorded on each of those streams: the
// block is reused only once every event has completed (polled at the next allocation). A block goes back to
// the library only once the device is idle (diopi_device_synchronize).
// empty_cache() gives the cached blocks back to the library; a failed malloc empties the device's cache
// and tries once more. Statistics follow c10::CachingDeviceAllocator's, so torch.accelerator's memory
// functions work on this device.
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "device.h"
#include "runtime.h"
#include "streams.h"

namespace diopi_bindings {

namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlock = 512;            // small sizes round up to multiples of this
constexpr size_t kSmallLimit = 1 << 20;      // above this, sizes round up to multiples of kLargeRound
constexpr size_t kLargeRound = 2 << 20;
constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);

size_t round_size(size_t nbytes) {
  if (nbytes <= kSmallLimit) return nbytes == 0 ? kMinBlock : (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock;
  return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

size_t pool_of(size_t size) {
  return static_cast<size_t>(size <= kSmallLimit ? StatType::SMALL_POOL : StatType::LARGE_POOL);
}

struct Block {
  void* ptr;
  c10::DeviceIndex device;
  size_t size;       // rounded: what the library allocated
  size_t requested;  // what torch asked for
  c10::StreamId stream = 0;            // allocated on, cached for
  std::vector<c10::StreamId> uses{};   // other streams that used it (record_stream)
};

// A freed block that other streams used: reusable once each of their events has completed.
struct Pending {
  Block* block;
  std::vector<void*> events;
};

// (stream, rounded size): the free lists' key
using CacheKey = std::pair<c10::StreamId, size_t>;

void report_refused_free(diopiError_t code) {
  const char* message = runtime().last_error ? runtime().last_error() : "";
  std::fprintf(stderr, "diopi: diopi_device_free failed (error %d): %s\n", static_cast<int>(code),
               message ? message : "");
}

class CachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    const size_t size = round_size(nbytes);
    const c10::StreamId stream = current_stream_id(device);
    settle_pending(device);
    Block* block = take_cached(device, stream, size);
    if (block == nullptr) block = new Block{malloc_or_retry(device, size), device, size, 0, stream};
    block->requested = nbytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      DeviceStats& stats = stats_[device];
      for (size_t type : {kAggregate, pool_of(size)}) {
        stats.allocation[type].increase(1);
        stats.active[type].increase(1);
        stats.allocated_bytes[type].increase(size);
        stats.active_bytes[type].increase(size);
        stats.requested_bytes[type].increase(nbytes);
      }
    }
    return {block->ptr, block, &CachingAllocator::release, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    const c10::DeviceIndex device = current_device();
    copy_d2d(device, dest, device, src, static_cast<int64_t>(count));
  }

  bool initialized() override { return attached(); }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    for (c10::DeviceIndex d = 0; d < static_cast<c10::DeviceIndex>(device_count()); ++d) empty_device(d);
  }

  // A stream other than the block's own that uses it: the block waits for that stream when freed.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get_deleter() != &CachingAllocator::release || !has_streams()) return;  // not ours, or no streams
    auto* block = static_cast<Block*>(ptr.get_context());
    TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1 && stream.device_index() == block->device,
                "diopi: record_stream with a stream of ", stream.device(), " for memory of diopi:",
                static_cast<int>(block->device));
    std::lock_guard<std::mutex> lock(mutex_);
    if (stream.id() != block->stream &&
        std::find(block->uses.begin(), block->uses.end(), stream.id()) == block->uses.end())
      block->uses.push_back(stream.id());
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_[device];
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    DeviceStats& s = for_each_stat(device, [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
    std::lock_guard<std::mutex> lock(mutex_);
    s.num_alloc_retries = s.num_ooms = s.num_device_alloc = s.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    for_each_stat(device, [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
  }

  void set_caching(bool on) { caching_ = on; }
  bool caching() const { return caching_; }

 private:
  // Applies `fn` to every statistic of `device` that tracks a current value and a peak.
  template <class Fn>
  DeviceStats& for_each_stat(c10::DeviceIndex device, Fn fn) {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = stats_[device];
    for (auto* array : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes,
                        &s.active_bytes, &s.requested_bytes})
      for (auto& stat : *array) fn(stat);
    return s;
  }

  // The deleter of every DataPtr: back to the free list (or to the library when caching is off).
  static void release(void* context);

  Block* take_cached(c10::DeviceIndex device, c10::StreamId stream, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& cached = free_[device];
    auto it = cached.find({stream, size});
    if (it == cached.end()) return nullptr;
    Block* block = it->second;
    cached.erase(it);
    return block;
  }

  void* malloc_or_retry(c10::DeviceIndex device, size_t size) {
    void* ptr = nullptr;
    diopiError_t code = runtime().device_malloc(device, static_cast<int64_t>(size), &ptr);
    if (code != DIOPI_SUCCESS) {  // perhaps out of memory: give the cached blocks back and try again
      empty_device(device);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_[device].num_alloc_retries += 1;
      }
      code = runtime().device_malloc(device, static_cast<int64_t>(size), &ptr);
      if (code != DIOPI_SUCCESS) {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_[device].num_ooms += 1;
      }
      check(code, "diopi_device_malloc");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& stats = stats_[device];
    stats.num_device_alloc += 1;
    for (size_t type : {kAggregate, pool_of(size)}) {
      stats.segment[type].increase(1);
      stats.reserved_bytes[type].increase(size);
    }
    return ptr;
  }

  // Frees a block in the library (outside the lock: the library may take its time).
  void free_block(Block* block) {
    // Queued work may still use the block: the library gets it back once the device is idle.
    if (has_streams()) (void)runtime().device_synchronize(block->device);
    const diopiError_t code = runtime().device_free(block->device, block->ptr);
    if (code != DIOPI_SUCCESS) report_refused_free(code);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& stats = stats_[block->device];
    stats.num_device_free += 1;
    for (size_t type : {kAggregate, pool_of(block->size)}) {
      stats.segment[type].decrease(1);
      stats.reserved_bytes[type].decrease(block->size);
    }
    delete block;
  }

  void empty_device(c10::DeviceIndex device) {
    std::multimap<CacheKey, Block*> cached;
    std::vector<Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cached.swap(free_[device]);
      pending.swap(pending_[device]);
    }
    for (auto& entry : cached) free_block(entry.second);
    for (Pending& p : pending) {  // free_block waits for the whole device first
      free_block(p.block);
      for (void* event : p.events) destroy_event(event);
    }
  }

  // Freed blocks whose streams have all passed their events go to the free lists.
  void settle_pending(c10::DeviceIndex device) {
    std::vector<Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pending_[device].empty()) return;
      pending.swap(pending_[device]);
    }
    std::vector<Pending> waiting;
    std::vector<Block*> ready;
    for (Pending& p : pending) {  // the library's queries, outside the lock
      if (std::all_of(p.events.begin(), p.events.end(), [](void* e) { return query_event(e); })) {
        for (void* event : p.events) destroy_event(event);
        ready.push_back(p.block);
      } else {
        waiting.push_back(std::move(p));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (Block* block : ready) free_[device].emplace(CacheKey{block->stream, block->size}, block);
    for (Pending& p : waiting) pending_[device].push_back(std::move(p));
  }

  std::mutex mutex_;
  bool caching_ = true;
  std::array<std::multimap<CacheKey, Block*>, 64> free_;  // per device: (stream, rounded size) -> cached block
  std::array<std::vector<Pending>, 64> pending_;         // per device: freed, waiting for other streams
  std::array<DeviceStats, 64> stats_;
};

// Never destroyed: storages freed while the process exits still reach it.
CachingAllocator& allocator_ = *new CachingAllocator();

void CachingAllocator::release(void* context) {
  auto* block = static_cast<Block*>(context);
  if (!attached()) {  // the process is shutting down without a library: nothing to give back to
    delete block;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(allocator_.mutex_);
    DeviceStats& stats = allocator_.stats_[block->device];
    for (size_t type : {kAggregate, pool_of(block->size)}) {
      stats.allocation[type].decrease(1);
      stats.active[type].decrease(1);
      stats.allocated_bytes[type].decrease(block->size);
      stats.active_bytes[type].decrease(block->size);
      stats.requested_bytes[type].decrease(block->requested);
    }
    if (allocator_.caching_ && block->uses.empty()) {
      allocator_.free_[block->device].emplace(CacheKey{block->stream, block->size}, block);
      return;
    }
  }
  if (!block->uses.empty() && allocator_.caching_) {  // an event on each stream that used it; reused once they pass
    Pending pending{block, {}};
    for (c10::StreamId stream : block->uses) {
      void* event = nullptr;
      record_event(&event, block->device, stream);
      pending.events.push_back(event);
    }
    block->uses.clear();
    std::lock_guard<std::mutex> lock(allocator_.mutex_);
    allocator_.pending_[block->device].push_back(std::move(pending));
    return;
  }
  allocator_.free_block(block);
}

}  // namespace

c10::Allocator* device_allocator() { return &allocator_; }

void set_caching(bool on) {
  allocator_.set_caching(on);
  if (!on) empty_cache();
}

void empty_cache() { allocator_.emptyCache({0, 0}); }

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "diopi: cannot resize a storage that is not resizable");
  const size_t old = storage.nbytes();
  if (nbytes == old) return;
  const c10::Device device = storage.device();
  c10::DeviceGuard guard(device);
  c10::DataPtr fresh = allocator_.allocate(nbytes);
  const size_t keep = std::min(old, nbytes);
  if (keep > 0)
    copy_d2d(device.index(), fresh.get(), device.index(), storage.data_ptr().get(), static_cast<int64_t>(keep));
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(nbytes);
}

}  // namespace diopi_bindings
