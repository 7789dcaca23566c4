// diopi_bindings._C_diopi: load an operator library written against DIOPI (<diopi/diopirt.h>,
// <diopi/functions.h>), check the DIOPI version it was built for, and route ATen overloads to it
// (diopi_functions.yaml) on the device _C_device made of PrivateUse1.
#include <dlfcn.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdio>
#include <string>

#include "cpu_fallback.h"
#include "frame.h"
#include "router.h"

namespace py = pybind11;

namespace diopi_bindings {

void bind_own_routes(py::module& m);  // own_router_module.cpp

namespace {

// This module's own symbols (the DIOPI runtime) made global, so the library's references bind to them.
void export_runtime() {
  Dl_info info{};
  TORCH_CHECK(dladdr(reinterpret_cast<void*>(&diopiGetTensorData), &info) != 0 && info.dli_fname != nullptr,
              "diopi: cannot find the module that holds the DIOPI runtime");
  void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  TORCH_CHECK(self != nullptr, "diopi: cannot make the DIOPI runtime global: ", dlerror());
}

const char* call_string(void* library, const char* name) {
  auto fn = reinterpret_cast<const char* (*)()>(dlsym(library, name));
  return fn != nullptr ? fn() : nullptr;
}

py::dict attach(const std::string& path) {
  export_runtime();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(library != nullptr, "diopi: cannot load ", path, ": ", dlerror());
  const char* version = call_string(library, "diopiGetVersion");
  if (version == nullptr) {
    dlclose(library);
    TORCH_CHECK(false, "diopi: ", path, " is not a DIOPI library: it does not export diopiGetVersion (expected \"DIOPI ",
                "Version: ", DIOPI_VER_MAJOR, ".x.y\", defined by every library built against <diopi/diopirt.h>)");
  }
  int major = -1, minor = -1, patch = -1;
  const std::string text(version);
  const bool parsed = std::sscanf(text.c_str(), "DIOPI Version: %d.%d.%d", &major, &minor, &patch) == 3 ||
                      std::sscanf(text.c_str(), "%d.%d.%d", &major, &minor, &patch) == 3;
  if (!parsed || major != DIOPI_VER_MAJOR) {
    dlclose(library);
    TORCH_CHECK(false, "diopi: ", path, " was built against \"", text, "\"; this framework speaks DIOPI ", DIOPI_VER_MAJOR,
                ".x (DIOPI Version: ", DIOPI_VER_MAJOR, ".", DIOPI_VER_MINOR, ".", DIOPI_VER_PATCH,
                "): rebuild the library against this diopirt.h");
  }
  auto last_error = reinterpret_cast<const char* (*)()>(dlsym(library, "diopiGetLastErrorString"));
  py::dict out;
  out["version"] = text;
  const char* vendor = call_string(library, "diopiGetVendorName");
  const char* impl = call_string(library, "diopiGetImplVersion");
  out["vendor"] = vendor != nullptr ? vendor : "";
  out["impl_version"] = impl != nullptr ? impl : "";
  out["routed"] = register_routes(library, last_error);
  return out;
}

}  // namespace

}  // namespace diopi_bindings

PYBIND11_MODULE(_C_diopi, m) {
  using namespace diopi_bindings;
  m.doc() = "ATen routed to a DIOPI operator library (DeepLink's interface) on the diopi device";
  bind_own_routes(m);
  m.def("attach", &attach, py::arg("path"),
        "Load a DIOPI library, check its version and route the table's ATen overloads it implements; once per process.");
  m.def("export_runtime", &export_runtime,
        "Make the DIOPI runtime functions (diopiGetTensorData, ...) global, so a library loaded later binds to them.");
  m.def("route_counts", []() {
    py::list out;
    for (const RouteCount& c : route_counts()) out.append(py::make_tuple(c.aten, c.diopi, c.routed, c.fallback));
    return out;
  }, "(aten overload, DIOPI function, calls served by the library, calls that fell back to the CPU) per route used.");
  m.def("register_fallback", [](py::function first_fallback) {
    // Leaked on purpose: called from any thread for as long as the process lives, never destroyed at exit.
    auto* callback = new py::object(std::move(first_fallback));
    register_fallback([callback](const std::string& name) {
      py::gil_scoped_acquire gil;
      try {
        (*callback)(name);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("diopi: the fallback's log");
      }
    });
  }, py::arg("first_fallback"),
        "Make the C++ CPU fallback PrivateUse1's boxed fallback; first_fallback(overload) is called the first time an "
        "overload falls back. Once per process.");
  m.def("draw_explicitly", &draw_explicitly,
        "ATen's random operators without a generator argument that the fallback runs with the device generator explicit.");
  m.def("fallback_counts", []() {
    py::dict out;
    for (const auto& [name, n] : fallback_counts()) out[py::str(name)] = n;
    return out;
  }, "ATen overload -> calls the device's fallback ran on the CPU.");
  m.def("fallback_copies", []() {
    py::dict out;
    for (const auto& [reason, n] : fallback_copies()) out[py::str(reason)] = n;
    return out;
  }, "Reason -> tensor copies the CPU fallback made (inputs to the host, results and written arguments back).");
  m.def("route_table", []() {
    py::list out;
    for (size_t i = 0; i < kRouteCount; ++i) {
      std::string aten = std::string(kRoutes[i].name) + (kRoutes[i].overload[0] ? "." : "") + kRoutes[i].overload;
      out.append(py::make_tuple(aten, kRoutes[i].diopi));
    }
    return out;
  }, "Every (aten overload, DIOPI function) of the generated table.");
}
