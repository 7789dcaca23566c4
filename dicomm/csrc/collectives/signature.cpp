#include <cstdio>

#include "core/communicator.h"

namespace dicomm {

// Replaced by the collectives layer's decoder of (operation, dtype, op, count) signatures.
std::function<std::string(uint64_t)> Communicator::describe_meta = [](uint64_t meta) {
  char text[32];
  std::snprintf(text, sizeof(text), "meta 0x%016llx", static_cast<unsigned long long>(meta));
  return std::string(text);
};

}  // namespace dicomm
