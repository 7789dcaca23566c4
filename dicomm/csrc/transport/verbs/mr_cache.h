// Memory registration with a cache keyed by (address, length): a buffer sent or received again is
// registered once. Entries in use are pinned by a reference count; idle ones are evicted least
// recently used past DICOMM_IB_REG_CACHE entries (0 turns caching off: register per message).
// A freed and reused range (same address and length, other pages, whole or in part) would hit a
// stale registration: where /proc/self/pagemap shows page frames (CAP_SYS_ADMIN), a hit on an idle
// entry compares a digest of every page's frame with the one taken at registration and registers
// again when they differ.
// Without that privilege the cache trusts that a cached range keeps its pages (the usual
// assumption of caches without memory hooks); DICOMM_IB_REG_CACHE=0 is the escape hatch.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <string>
#include <utility>

#include "transport/verbs/accel.h"
#include "transport/verbs/ibv_api.h"
#include "transport/verbs/page_ids.h"

namespace dicomm::transport::verbs {

struct Registration {
  const void* addr = nullptr;
  size_t len = 0;
  ibv::mr* mr = nullptr;       // null: the buffer cannot be registered and must be staged
  bool device = false;          // accelerator memory
  DevicePath path = DevicePath::kUnprobed;  // for device memory: how it is reached
  int refs = 0;
  PageIds pages;                // host memory: the pages pinned at registration (when visible)
  std::list<Registration*>::iterator lru;
  uint32_t lkey() const { return mr ? mr->lkey : 0; }
  uint32_t rkey() const { return mr ? mr->rkey : 0; }
};

class MrCache {
 public:
  // Keeps up to `capacity` idle registrations (DICOMM_IB_REG_CACHE); `force_staging`: host memory
  // is treated as unregistrable, so it takes the CPU-mediated path (DICOMM_IB_FORCE_STAGING).
  MrCache(const IbvApi& api, ibv::pd* pd, const std::string& nic, size_t capacity, bool force_staging);
  ~MrCache();
  // Never null. Throws Error when host memory cannot be registered (e.g. the locked-memory limit).
  Registration* acquire(const void* addr, size_t len);
  void release(Registration* r);
  // Host memory standing in for device memory that cannot be registered (tests the staging path).
  bool force_staging() const { return force_staging_; }
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }
  size_t stale() const { return stale_; }  // cached ranges found mapped to other pages, registered anew
  std::string device_path_why() const { return device_why_; }

 private:
  void evict();
  void drop(Registration* r);
  const IbvApi& api_;
  ibv::pd* pd_;  // not owned: the Nic's, which owns this cache and releases it first
  std::string nic_;
  size_t capacity_;
  bool force_staging_;
  std::map<std::pair<const void*, size_t>, Registration*> map_;
  std::list<Registration*> idle_;  // least recently used first
  size_t hits_ = 0, misses_ = 0, stale_ = 0;
  std::string device_why_;
};

}  // namespace dicomm::transport::verbs
