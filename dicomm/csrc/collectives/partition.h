// Splitting a buffer into near-equal blocks (one per rank) and blocks into pipeline chunks. Every
// rank computes the same split from the same arguments, so no sizes travel on the wire.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace dicomm {

// `total` items in `parts` parts; the first total % parts parts get one extra item.
struct Partition {
  size_t total;
  size_t parts;
  size_t offset(size_t i) const { return (total / parts) * i + std::min(i, total % parts); }
  size_t length(size_t i) const { return total / parts + (i < total % parts ? 1 : 0); }
  size_t max_length() const { return total / parts + (total % parts ? 1 : 0); }
};

// How many chunks of at most `chunk_bytes` a message of `bytes` needs, capped at `max_chunks`
// (chunks grow past `chunk_bytes` beyond the cap) and at least 1 so empty messages still travel.
inline size_t chunk_count(size_t bytes, size_t chunk_bytes, size_t max_chunks) {
  const size_t n = (bytes + chunk_bytes - 1) / std::max<size_t>(chunk_bytes, 1);
  return std::clamp<size_t>(n, 1, std::max<size_t>(max_chunks, 1));
}

}  // namespace dicomm
