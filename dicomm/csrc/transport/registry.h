// The transports a communicator opens, in the order they registered. Each built-in transport
// registers itself from its own file (a static TransportRegistrar), so the engine opens and chooses
// transports without naming any: a new transport is one more file, core/ unchanged. A transport
// built elsewhere (another module) registers through register_transport() before the first
// communicator that should use it is created (python/module.cpp: `_C._register_transport`).
#pragma once

#include <string>
#include <vector>

#include "transport/transport.h"

namespace dicomm::transport {

// The name of a capsule holding a TransportFactory (the version is Capabilities::kVersion's).
constexpr const char* kTransportFactoryCapsule = "dicomm.TransportFactory/1";

// Every registered factory, as of now.
std::vector<TransportFactory> registered_transports();

// Throws ValueError when a transport of that name is registered already, or the factory is empty.
void register_transport(TransportFactory factory);

// Registers `factory` at static-initialisation time (a duplicate name there is a build error,
// reported by registered_transports()).
struct TransportRegistrar {
  explicit TransportRegistrar(TransportFactory factory);
};

}  // namespace dicomm::transport
