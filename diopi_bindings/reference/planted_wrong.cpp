// Which kernels a test build plants wrong (DIOPI_REF_PLANT_WRONG: comma-separated symbols). The one source a
// test build compiles for itself: the others are compiled once and linked into every library of a build.
#include <string>

#include "tensor_io.h"

namespace diopi_ref {

bool planted_wrong(const char* symbol) {
#ifdef DIOPI_REF_PLANT_WRONG
  const std::string list = std::string(",") + DIOPI_REF_PLANT_WRONG + ",";
  return list.find(std::string(",") + symbol + ",") != std::string::npos;
#else
  (void)symbol;
  return false;
#endif
}

}  // namespace diopi_ref
