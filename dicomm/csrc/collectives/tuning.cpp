#include "collectives/tuning.h"

#include <cstdlib>
#include <string>

#include "core/types.h"

namespace dicomm {
namespace {

bool env_size(const char* name, size_t& out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0')
    throw ValueError(std::string(name) + "='" + text + "' is not a byte count");
  out = static_cast<size_t>(value);
  return true;
}

Tuning load() {
  Tuning t;
  if (env_size("DICOMM_COLL_CHUNK_BYTES", t.chunk_bytes) && t.chunk_bytes == 0)
    throw ValueError("DICOMM_COLL_CHUNK_BYTES must be positive");
  size_t small = 0;
  if (env_size("DICOMM_COLL_SMALL_BYTES", small)) {
    t.all_reduce_ring_bytes = t.broadcast_chain_bytes = t.reduce_ring_bytes = small;
    t.all_gather_ring_bytes = t.reduce_scatter_ring_bytes = small;
  }
  return t;
}

}  // namespace

const Tuning& Tuning::get() {
  static const Tuning tuning = load();
  return tuning;
}

}  // namespace dicomm
