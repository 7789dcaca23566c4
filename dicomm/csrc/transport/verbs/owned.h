// Owners of what libibverbs hands out, each released through the loaded library (IbvApi), and of
// aligned host memory. Members of these types declared in dependency order (memory, registration,
// completion channel, completion queue, queue pair) are released in reverse when their owner is
// destroyed, or when its constructor throws halfway: nothing leaks either way.
#pragma once

#include <cstdlib>
#include <memory>

#include "transport/verbs/ibv_api.h"

namespace dicomm::transport::verbs {

template <typename T, int (*IbvApi::*Release)(T*)>
struct IbvRelease {
  const IbvApi* api = nullptr;  // not owned: the loaded library, never unloaded
  void operator()(T* p) const {
    if (p) (api->*Release)(p);
  }
};

using OwnedContext = std::unique_ptr<ibv::context, IbvRelease<ibv::context, &IbvApi::close_device>>;
using OwnedPd = std::unique_ptr<ibv::pd, IbvRelease<ibv::pd, &IbvApi::dealloc_pd>>;
using OwnedMr = std::unique_ptr<ibv::mr, IbvRelease<ibv::mr, &IbvApi::dereg_mr>>;
using OwnedCompChannel = std::unique_ptr<ibv::comp_channel, IbvRelease<ibv::comp_channel, &IbvApi::destroy_comp_channel>>;
using OwnedCq = std::unique_ptr<ibv::cq, IbvRelease<ibv::cq, &IbvApi::destroy_cq>>;
using OwnedQp = std::unique_ptr<ibv::qp, IbvRelease<ibv::qp, &IbvApi::destroy_qp>>;

struct FreeMemory {
  void operator()(char* p) const { std::free(p); }
};
using AlignedMemory = std::unique_ptr<char, FreeMemory>;  // from std::aligned_alloc

}  // namespace dicomm::transport::verbs
