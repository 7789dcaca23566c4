// Memory statistics for the CPU as a device: a counting layer over torch's CPU allocator, so that
// memory_allocated / max_memory_allocated mean on the CPU what they mean on an accelerator (the bytes of
// live tensor storage and their peak), not the process's resident set, which also holds the
// interpreter, libraries and the C heap's free lists.
//
// Each allocation asks the allocator that was installed before (torch's default one, or whatever a
// library put there) for 64 bytes more and keeps, in those 64 bytes, the size and the inner allocation's
// context and deleter. The pointer handed out is the data itself with the data as its context (a
// "simple" data pointer, as torch's own allocator gives, so copy-on-write clones and the like keep
// working), and alignment stays 64 bytes. Loaded with ctypes: plain C entry points, no Python API.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

namespace {

constexpr std::size_t kHeader = 64;  // c10's CPU alignment: the data after the header stays aligned

struct Header {
  std::size_t bytes;
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
};
static_assert(sizeof(Header) <= kHeader, "the header must fit in front of the data");

std::atomic<std::int64_t> g_current{0};
std::atomic<std::int64_t> g_peak{0};

void count_in(std::size_t n) {
  const auto now = g_current.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed) +
                   static_cast<std::int64_t>(n);
  auto peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void release(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  Header h{};
  std::memcpy(&h, base, sizeof h);
  g_current.fetch_sub(static_cast<std::int64_t>(h.bytes), std::memory_order_relaxed);
  if (h.inner_deleter != nullptr) h.inner_deleter(h.inner_context);
}

class CountingCPUAllocator final : public c10::Allocator {
 public:
  explicit CountingCPUAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return inner_->allocate(0);
    c10::DataPtr raw = inner_->allocate(n + kHeader);
    auto* base = static_cast<char*>(raw.get());
    if (base == nullptr) throw std::bad_alloc();
    Header h{n, nullptr, raw.get_deleter()};
    h.inner_context = raw.release_context();
    std::memcpy(base, &h, sizeof h);
    count_in(n);
    void* data = base + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
};

CountingCPUAllocator* g_installed = nullptr;

}  // namespace

extern "C" {

// Puts the counting layer over the CPU allocator in use; a second call does nothing. Storage allocated
// before stays with its own deleter and is not counted. Returns 1 when installed by this call, 0 when
// it already was.
__attribute__((visibility("default"))) int ditorch_cpu_memory_install() {
  if (g_installed != nullptr) return 0;
  c10::Allocator* current = c10::GetCPUAllocator();
  // Never freed: storage allocated through it may outlive any point where it could be.
  g_installed = new CountingCPUAllocator(current);
  // The highest priority: a later registration at a lower one must not replace the counter unseen.
  c10::SetCPUAllocator(g_installed, UINT8_MAX);
  return 1;
}

__attribute__((visibility("default"))) int ditorch_cpu_memory_active() {
  return g_installed != nullptr && c10::GetCPUAllocator() == g_installed ? 1 : 0;
}

__attribute__((visibility("default"))) std::int64_t ditorch_cpu_memory_allocated() {
  return g_current.load(std::memory_order_relaxed);
}

__attribute__((visibility("default"))) std::int64_t ditorch_cpu_memory_peak() {
  return g_peak.load(std::memory_order_relaxed);
}

// The peak restarts from what is allocated now (torch.cuda.reset_peak_memory_stats's meaning).
__attribute__((visibility("default"))) void ditorch_cpu_memory_reset_peak() {
  g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // extern "C"
