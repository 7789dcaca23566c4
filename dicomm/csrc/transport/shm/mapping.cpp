#include <cerrno>
#include <sys/mman.h>

#include "core/types.h"
#include "transport/shm/shm_conn.h"
#include "transport/socket.h"

namespace dicomm::transport::shm {

Mapping::Mapping(int fd) {
  void* p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error("shm: cannot map the pair's segment: " + errno_text(errno));
  seg_ = static_cast<Segment*>(p);
}

Mapping::~Mapping() { munmap(seg_, sizeof(Segment)); }

}  // namespace dicomm::transport::shm
