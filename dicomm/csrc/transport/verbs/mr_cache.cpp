#include "transport/verbs/mr_cache.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "core/log.h"
#include "core/types.h"

namespace dicomm::transport::verbs {
namespace {
constexpr int kAccess = ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_READ | ibv::ACCESS_REMOTE_WRITE;

}  // namespace

MrCache::MrCache(const IbvApi& api, ibv::pd* pd, const std::string& nic, size_t capacity, bool force_staging)
    : api_(api), pd_(pd), nic_(nic), capacity_(capacity), force_staging_(force_staging) {}

MrCache::~MrCache() {
  for (auto& [key, r] : map_) {
    if (r->mr) api_.dereg_mr(r->mr);
    delete r;
  }
}

Registration* MrCache::acquire(const void* addr, size_t len) {
  auto key = std::make_pair(addr, len);
  auto it = map_.find(key);
  if (it != map_.end()) {
    Registration* r = it->second;
    // Only an idle entry can have been freed by its owner; one pagemap read per 4096 pages per hit.
    if (r->refs == 0 && r->pages.known() && !(page_ids(addr, len) == r->pages)) {
      ++stale_;
      idle_.erase(r->lru);
      drop(r);
      log(LogLevel::kDebug, "verbs: " + std::to_string(len) + " B cached at a freed and reused address: registered again");
    } else {
      if (r->refs++ == 0) idle_.erase(r->lru);
      ++hits_;
      return r;
    }
  }
  ++misses_;
  auto* r = new Registration();
  r->addr = addr;
  r->len = len;
  r->refs = 1;
  Accel& accel = Accel::get();
  r->device = accel.is_device(addr);
  if (r->device) {
    r->path = accel.probe(api_, pd_, addr, len, &device_why_);
    if (r->path == DevicePath::kDmabuf) {
      uint64_t off = 0;
      int fd = accel.export_dmabuf(addr, len, &off);
      if (fd >= 0) {
        r->mr = api_.reg_dmabuf_mr(pd_, off, len, reinterpret_cast<uintptr_t>(addr), fd, kAccess);
        close(fd);
      }
    } else if (r->path == DevicePath::kPeerMemory) {
      r->mr = api_.reg_mr(pd_, const_cast<void*>(addr), len, kAccess);
    }
    if (!r->mr) r->path = DevicePath::kCpuMediated;
  } else if (!force_staging_) {
    r->mr = api_.reg_mr(pd_, const_cast<void*>(addr), len, kAccess);
    if (r->mr) r->pages = page_ids(addr, len);  // pinned now: present
    if (!r->mr) {
      int err = errno;
      delete r;
      throw Error("verbs: registering " + std::to_string(len) + " B of host memory with " + nic_ + " failed: " +
                  std::strerror(err) + (err == ENOMEM ? " (raise the locked-memory limit: ulimit -l)" : ""));
    }
  } else {
    r->path = DevicePath::kCpuMediated;  // host memory standing in for unregistrable device memory
  }
  map_[key] = r;
  return r;
}

void MrCache::release(Registration* r) {
  if (--r->refs > 0) return;
  idle_.push_back(r);
  r->lru = std::prev(idle_.end());
  evict();
}

void MrCache::evict() {
  while (idle_.size() > capacity_) {
    Registration* r = idle_.front();
    idle_.pop_front();
    drop(r);
  }
}

void MrCache::drop(Registration* r) {
  map_.erase(std::make_pair(r->addr, r->len));
  if (r->mr) api_.dereg_mr(r->mr);
  delete r;
}

}  // namespace dicomm::transport::verbs
