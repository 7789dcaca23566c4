// Pieces of the `dicomm._C` module, each bound by the part of the engine that owns it.
#pragma once

#include <memory>
#include <pybind11/pybind11.h>

#include "core/communicator.h"

namespace dicomm::python {

using CommClass = pybind11::class_<Communicator, std::shared_ptr<Communicator>>;

// collectives/ : adds broadcast, all_reduce, ... methods to the Communicator class.
void bind_collectives(pybind11::module_& m, CommClass& comm);

}  // namespace dicomm::python
