// Device memory of the reference library: host memory, but kept honestly per device. Every block is
// tagged with the device it was allocated on; a free or a copy must name that device and stay inside
// the block, or the call fails with DIOPI_ERR_INVALID_ARGUMENT. The number of devices is
// $DIOPI_REFERENCE_DEVICES (default 2), so multi-device code paths run on any host.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "tensor_io.h"

namespace {

constexpr int32_t kDefaultDevices = 2;
constexpr std::size_t kAlignment = 64;

struct Block {
  int32_t device;
  int64_t nbytes;
};

std::mutex blocks_mutex;
std::map<uintptr_t, Block> blocks;  // by start address
int64_t malloc_calls = 0;           // guarded by blocks_mutex
thread_local int32_t current_device = 0;

int32_t device_count() {
  static const int32_t count = [] {
    const char* env = std::getenv("DIOPI_REFERENCE_DEVICES");
    if (env == nullptr || *env == '\0') return kDefaultDevices;
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    return (*end == '\0' && n >= 1 && n <= 64) ? int32_t(n) : kDefaultDevices;
  }();
  return count;
}

void check_device(int32_t device) {
  if (device < 0 || device >= device_count())
    diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "device " + std::to_string(device) + " out of range: this library has " +
                                                    std::to_string(device_count()) + " device(s)");
}

// The range [ptr, ptr + nbytes) must lie inside one block allocated on `device`.
void check_range(int32_t device, const void* ptr, int64_t nbytes, const char* what) {
  check_device(device);
  if (nbytes < 0) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(what) + ": negative size");
  if (nbytes == 0) return;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(blocks_mutex);
  auto it = blocks.upper_bound(addr);
  if (it == blocks.begin()) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(what) + " is not device memory");
  --it;
  const Block& b = it->second;
  if (addr + uint64_t(nbytes) > it->first + uint64_t(b.nbytes))
    diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(what) + " is not device memory or runs past its allocation");
  if (b.device != device)
    diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(what) + " belongs to device " + std::to_string(b.device) +
                                                    ", not device " + std::to_string(device));
}

// (A kernel's lambda sees __func__ as "operator()": callers name themselves.)
// A test build may plant one wrong copy direction (DIOPI_REF_PLANT_WRONG=diopi_memcpy_d2h...): the
// conformance suite's round trips must catch it.
void copy(const char* symbol, void* dst, const void* src, int64_t nbytes) {
  if (nbytes > 0) std::memmove(dst, src, std::size_t(nbytes));
  if (nbytes > 0 && diopi_ref::planted_wrong(symbol)) static_cast<unsigned char*>(dst)[nbytes - 1] ^= 0x5a;
}

}  // namespace

extern "C" {

DIOPI_API diopiError_t diopi_device_count(int32_t* count) {
  return diopi_ref::guarded(__func__, [&] {
    if (count == nullptr) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "count is NULL");
    *count = device_count();
  });
}

DIOPI_API diopiError_t diopi_set_device(int32_t device) {
  return diopi_ref::guarded(__func__, [&] {
    check_device(device);
    current_device = device;
  });
}

DIOPI_API diopiError_t diopi_get_device(int32_t* device) {
  return diopi_ref::guarded(__func__, [&] {
    if (device == nullptr) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "device is NULL");
    *device = current_device;
  });
}

DIOPI_API diopiError_t diopi_device_malloc(int32_t device, int64_t nbytes, void** ptr) {
  return diopi_ref::guarded(__func__, [&] {
    check_device(device);
    if (ptr == nullptr) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "ptr is NULL");
    if (nbytes < 0) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "negative size " + std::to_string(nbytes));
    // One byte at least, so that every block has its own address.
    void* p = ::operator new(std::size_t(nbytes > 0 ? nbytes : 1), std::align_val_t(kAlignment), std::nothrow);
    if (p == nullptr) diopi_ref::fail(DIOPI_ERR_ALLOCATION, "out of memory allocating " + std::to_string(nbytes) + " bytes");
    std::lock_guard<std::mutex> lock(blocks_mutex);
    blocks[reinterpret_cast<uintptr_t>(p)] = Block{device, nbytes};
    ++malloc_calls;
    *ptr = p;
  });
}

DIOPI_API diopiError_t diopi_device_free(int32_t device, void* ptr) {
  return diopi_ref::guarded(__func__, [&] {
    check_device(device);
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(blocks_mutex);
    auto it = blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == blocks.end())
      diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "free of a pointer this library did not allocate (or freed already)");
    if (it->second.device != device)
      diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "free on device " + std::to_string(device) + " of memory of device " +
                                                      std::to_string(it->second.device));
    blocks.erase(it);
    ::operator delete(ptr, std::align_val_t(kAlignment));
  });
}

DIOPI_API diopiError_t diopi_memcpy_h2d(int32_t device, void* dst, const void* src, int64_t nbytes) {
  return diopi_ref::guarded(__func__, [&] {
    check_range(device, dst, nbytes, "dst");
    copy("diopi_memcpy_h2d", dst, src, nbytes);
  });
}

DIOPI_API diopiError_t diopi_memcpy_d2h(int32_t device, void* dst, const void* src, int64_t nbytes) {
  return diopi_ref::guarded(__func__, [&] {
    check_range(device, src, nbytes, "src");
    copy("diopi_memcpy_d2h", dst, src, nbytes);
  });
}

DIOPI_API diopiError_t diopi_memcpy_d2d(int32_t dst_device, void* dst, int32_t src_device, const void* src,
                                        int64_t nbytes) {
  return diopi_ref::guarded(__func__, [&] {
    check_range(dst_device, dst, nbytes, "dst");
    check_range(src_device, src, nbytes, "src");
    copy("diopi_memcpy_d2d", dst, src, nbytes);
  });
}

DIOPI_API diopiError_t diopi_device_synchronize(int32_t device) {
  return diopi_ref::guarded(__func__, [&] { check_device(device); });
}

}  // extern "C"

// Streams and events: the reference runs every call to completion before it returns, so a stream is a
// token of its device, synchronizing is a check of the arguments, and an event is complete when recorded.
namespace {
struct Token {
  int32_t device;
};
void check_token(int32_t device, const void* token, const char* what) {
  check_device(device);
  if (token == nullptr) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
  if (static_cast<const Token*>(token)->device != device)
    diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(what) + " belongs to another device");
}
void* new_token(int32_t device, void** out) {
  check_device(device);
  if (out == nullptr) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "the result pointer is NULL");
  *out = new Token{device};
  return *out;
}
void set_done(int32_t* done) {
  if (done == nullptr) diopi_ref::fail(DIOPI_ERR_INVALID_ARGUMENT, "done is NULL");
  *done = 1;
}
}  // namespace

extern "C" {

DIOPI_API diopiError_t diopi_stream_create(int32_t device, void** stream) {
  return diopi_ref::guarded(__func__, [&] { new_token(device, stream); });
}
DIOPI_API diopiError_t diopi_stream_destroy(int32_t device, void* stream) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, stream, "stream");
    delete static_cast<Token*>(stream);
  });
}
DIOPI_API diopiError_t diopi_stream_synchronize(int32_t device, void* stream) {
  return diopi_ref::guarded(__func__, [&] { check_token(device, stream, "stream"); });
}
DIOPI_API diopiError_t diopi_stream_query(int32_t device, void* stream, int32_t* done) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, stream, "stream");
    set_done(done);
  });
}
DIOPI_API diopiError_t diopi_memcpy_h2d_async(int32_t device, void* dst, const void* src, int64_t nbytes, void* stream) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, stream, "stream");
    check_range(device, dst, nbytes, "dst");
    copy("diopi_memcpy_h2d_async", dst, src, nbytes);
  });
}
DIOPI_API diopiError_t diopi_memcpy_d2h_async(int32_t device, void* dst, const void* src, int64_t nbytes, void* stream) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, stream, "stream");
    check_range(device, src, nbytes, "src");
    copy("diopi_memcpy_d2h_async", dst, src, nbytes);
  });
}
DIOPI_API diopiError_t diopi_event_create(int32_t device, void** event) {
  return diopi_ref::guarded(__func__, [&] { new_token(device, event); });
}
DIOPI_API diopiError_t diopi_event_destroy(int32_t device, void* event) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, event, "event");
    delete static_cast<Token*>(event);
  });
}
DIOPI_API diopiError_t diopi_event_record(int32_t device, void* event, void* stream) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, event, "event");
    check_token(device, stream, "stream");
  });
}
DIOPI_API diopiError_t diopi_event_query(int32_t device, void* event, int32_t* done) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, event, "event");
    set_done(done);
  });
}
DIOPI_API diopiError_t diopi_event_synchronize(int32_t device, void* event) {
  return diopi_ref::guarded(__func__, [&] { check_token(device, event, "event"); });
}
DIOPI_API diopiError_t diopi_stream_wait_event(int32_t device, void* stream, void* event) {
  return diopi_ref::guarded(__func__, [&] {
    check_token(device, stream, "stream");
    check_token(device, event, "event");
  });
}

// Not part of the ABI (no diopi_ prefix): how often diopi_device_malloc succeeded and how many blocks are
// live, so tests can see a framework's caching allocator at work.
DIOPI_API int64_t diopiref_malloc_calls(void) {
  std::lock_guard<std::mutex> lock(blocks_mutex);
  return malloc_calls;
}

DIOPI_API int64_t diopiref_live_blocks(void) {
  std::lock_guard<std::mutex> lock(blocks_mutex);
  return static_cast<int64_t>(blocks.size());
}
}  // extern "C"
