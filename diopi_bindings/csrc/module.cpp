// diopi_bindings._C_device: attach a DIOPI library's device-memory functions and make PrivateUse1 a
// device over them. Importing the module registers nothing; attach() does, once per process.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <map>
#include <string>

#include "device.h"
#include "runtime.h"
#include "streams.h"

namespace py = pybind11;

namespace diopi_bindings {

namespace {

template <class Fn>
void take(const std::map<std::string, uintptr_t>& addresses, const char* name, Fn& slot) {
  auto it = addresses.find(name);
  TORCH_CHECK(it != addresses.end() && it->second != 0, "diopi: the library does not export ", name,
              " (the device-memory functions of diopi/diopirt.h)");
  slot = reinterpret_cast<Fn>(it->second);
}

// The stream and event functions: all of them, or none (then the library completes calls before returning).
void take_streams(const std::map<std::string, uintptr_t>& addresses, RuntimeTable& table) {
  static const char* const kNames[] = {"diopi_stream_create", "diopi_stream_destroy", "diopi_stream_synchronize",
                                       "diopi_stream_query", "diopi_memcpy_h2d_async", "diopi_memcpy_d2h_async",
                                       "diopi_event_create", "diopi_event_destroy", "diopi_event_record",
                                       "diopi_event_query", "diopi_event_synchronize", "diopi_stream_wait_event"};
  std::string missing;
  size_t present = 0;
  for (const char* name : kNames) {
    auto it = addresses.find(name);
    if (it != addresses.end() && it->second != 0) ++present;
    else missing += std::string(missing.empty() ? "" : ", ") + name;
  }
  if (present == 0) return;
  TORCH_CHECK(missing.empty(), "diopi: the library exports some stream and event functions but not ", missing,
              " (diopi/diopirt.h: all of them, or none)");
  take(addresses, "diopi_stream_create", table.stream_create);
  take(addresses, "diopi_stream_destroy", table.stream_destroy);
  take(addresses, "diopi_stream_synchronize", table.stream_synchronize);
  take(addresses, "diopi_stream_query", table.stream_query);
  take(addresses, "diopi_memcpy_h2d_async", table.memcpy_h2d_async);
  take(addresses, "diopi_memcpy_d2h_async", table.memcpy_d2h_async);
  take(addresses, "diopi_event_create", table.event_create);
  take(addresses, "diopi_event_destroy", table.event_destroy);
  take(addresses, "diopi_event_record", table.event_record);
  take(addresses, "diopi_event_query", table.event_query);
  take(addresses, "diopi_event_synchronize", table.event_synchronize);
  take(addresses, "diopi_stream_wait_event", table.stream_wait_event);
}

void attach_library(const std::map<std::string, uintptr_t>& addresses) {
  RuntimeTable table;
  take(addresses, "diopi_device_count", table.device_count);
  take(addresses, "diopi_set_device", table.set_device);
  take(addresses, "diopi_get_device", table.get_device);
  take(addresses, "diopi_device_malloc", table.device_malloc);
  take(addresses, "diopi_device_free", table.device_free);
  take(addresses, "diopi_memcpy_h2d", table.memcpy_h2d);
  take(addresses, "diopi_memcpy_d2h", table.memcpy_d2h);
  take(addresses, "diopi_memcpy_d2d", table.memcpy_d2d);
  take(addresses, "diopi_device_synchronize", table.device_synchronize);
  take(addresses, "diopi_last_error", table.last_error);
  take_streams(addresses, table);
  int32_t count = 0;
  const diopiError_t code = table.device_count(&count);
  TORCH_CHECK(code == DIOPI_SUCCESS, "diopi: diopi_device_count failed (error ", static_cast<int>(code), ")");
  attach(table, count);
  c10::SetAllocator(c10::DeviceType::PrivateUse1, device_allocator());
  register_guard();
  register_hooks();
  register_kernels();
  ensure_autograd_queues();
  // Python's atexit runs before finalization begins, with the interpreter intact (autograd_queues.cpp).
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    py::gil_scoped_release no_gil;
    drain_autograd_threads(std::chrono::seconds(10));
  }));
}

}  // namespace

}  // namespace diopi_bindings

PYBIND11_MODULE(_C_device, m) {
  using namespace diopi_bindings;
  m.doc() = "PrivateUse1 as a device over a DIOPI library's device-memory functions";
  m.def("attach", &attach_library, py::arg("addresses"),
        "Register the device over these C function pointers (name -> address); once per process.");
  m.def("attached", &attached);
  m.def("device_count", []() { return device_count(); });
  m.def("current_device", []() { return static_cast<int>(current_device()); });
  m.def("set_device", [](int index) { set_current_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("synchronize", [](int index) {
    check_index(static_cast<c10::DeviceIndex>(index));
    check(runtime().device_synchronize(index), "diopi_device_synchronize");
  });
  m.def("has_streams", []() { return has_streams(); },
        "Whether the library exports streams and events (its operators may run asynchronously).");
  m.def("synchronize_current_stream", [](int index) { synchronize_current_stream(static_cast<c10::DeviceIndex>(index)); },
        "Wait for the calling thread's current stream of the device (a no-op without library streams).");
  m.def("set_caching", [](bool on) { set_caching(on); },
        "Whether freed device memory is kept for reuse (default) or given back to the library at once.");
  m.def("empty_cache", []() { empty_cache(); }, "Give every cached block back to the library.");
  m.def("copy_counts", []() {
    py::dict out;
    out["host to device"] = copy_count(kHostToDevice);
    out["device to host"] = copy_count(kDeviceToHost);
    out["device to device"] = copy_count(kDeviceToDevice);
    out["device to host (item)"] = copy_count(kItem);
    return out;
  }, "Tensor copies of the device so far, by direction (every _copy_from and .item()).");
  m.def("default_generator", [](int index) {
    const at::Generator& gen =
        at::detail::getPrivateUse1Hooks().getDefaultGenerator(static_cast<c10::DeviceIndex>(index));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });
}
