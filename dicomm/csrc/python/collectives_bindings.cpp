#include "python/bindings.h"

namespace dicomm::python {

// Filled in by the collectives layer.
void bind_collectives(pybind11::module_& /*m*/, CommClass& /*comm*/) {}

}  // namespace dicomm::python
