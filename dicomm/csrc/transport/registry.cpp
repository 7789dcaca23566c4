#include "transport/registry.h"

#include <mutex>

#include "core/types.h"

namespace dicomm::transport {
namespace {

// Function-local statics: registrars in other files may run before this file's globals exist.
struct Registry {
  std::mutex mu;  // guards both fields (registration may come from any thread)
  std::vector<TransportFactory> factories;
  std::string duplicate;  // a name two static registrars used
};

Registry& registry() {
  static Registry r;
  return r;
}

bool known(const Registry& r, const std::string& name) {
  for (const auto& f : r.factories)
    if (f.name == name) return true;
  return false;
}

}  // namespace

TransportRegistrar::TransportRegistrar(TransportFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (known(r, factory.name)) r.duplicate = factory.name;
  r.factories.push_back(std::move(factory));
}

void register_transport(TransportFactory factory) {
  if (factory.name.empty() || factory.name == "auto" || !factory.open)
    throw ValueError("a transport needs a name other than 'auto' and an open function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (known(r, factory.name)) throw ValueError("a transport named '" + factory.name + "' is registered already");
  r.factories.push_back(std::move(factory));
}

std::vector<TransportFactory> registered_transports() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.duplicate.empty()) throw ValueError("two transports registered under the name '" + r.duplicate + "'");
  return r.factories;
}

}  // namespace dicomm::transport
