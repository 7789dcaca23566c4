// Which physical pages back a buffer, from /proc/self/pagemap: how the registration cache notices
// that a cached range was freed and mapped again (same address and length, other pages). The
// page frame numbers are visible only with CAP_SYS_ADMIN; without it nothing is known and the
// check is skipped (DICOMM_IB_REG_CACHE=0 stays the escape).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dicomm::transport::verbs {

struct PageIds {
  uint64_t first = 0, last = 0;  // frame numbers of the first and last page; 0 = unknown/absent
  bool known() const { return first != 0 && last != 0; }
  bool operator==(const PageIds& o) const { return first == o.first && last == o.last; }
};

PageIds page_ids(const void* addr, size_t len);

}  // namespace dicomm::transport::verbs
