// Cross-memory attach (process_vm_readv/writev) between ranks under Yama's ptrace_scope=1, where a
// process may be read only by its ancestors or by the one ptracer it names. Naming "any" would let
// every process of the same user read this rank's memory; instead each rank names the nearest
// common ancestor of the peers that attach to it (the launcher, for torchrun's workers).
#pragma once

#include <sys/types.h>

namespace dicomm::transport::shm {

// Lets `peer` attach to this process if Yama needs a ptracer for that; a no-op elsewhere.
void allow_cross_memory_attach_from(pid_t peer);

}  // namespace dicomm::transport::shm
