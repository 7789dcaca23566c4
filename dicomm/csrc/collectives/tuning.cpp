#include "collectives/tuning.h"

#include "core/config.h"

#include <cstdlib>
#include <string>

#include "core/types.h"

namespace dicomm {
namespace {


Tuning load() {
  Tuning t;
  t.chunk_bytes = static_cast<size_t>(config::integer("DICOMM_COLL_CHUNK_BYTES"));
  if (auto small = config::optional_integer("DICOMM_COLL_SMALL_BYTES")) {
    t.all_reduce_ring_bytes = t.broadcast_chain_bytes = t.reduce_ring_bytes = static_cast<size_t>(*small);
    t.all_gather_ring_bytes = t.reduce_scatter_ring_bytes = static_cast<size_t>(*small);
  }
  return t;
}

}  // namespace

const Tuning& Tuning::get() {
  static const Tuning tuning = load();
  return tuning;
}

}  // namespace dicomm
