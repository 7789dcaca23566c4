// The `dicomm._C_torch` module: the torch backend's creator and its error translation. Built
// against torch's own pybind11, so its classes and torch's share one type registry.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <string>
#include <vector>

#include "backend.h"
#include "errors.h"

namespace py = pybind11;
using dicomm::torch_backend::BackendError;
using dicomm::torch_backend::DicommBackend;
using dicomm::torch_backend::Kind;

namespace {

// Python classes per error kind (dicomm.errors.BACKEND_ERRORS), looked up once.
PyObject* g_classes[5] = {};

PyObject* class_for(Kind kind) { return g_classes[static_cast<int>(kind)]; }

// Backends still open at interpreter exit are closed first, so no engine thread outlives Python.
void close_all_at_exit() {
  auto live = dicomm::torch_backend::open_backends().take();
  py::gil_scoped_release release;
  for (auto& b : live) b->shutdown();
}

// Settings from Python: a dict of str to str, anything else a TypeError naming the entry (the
// engine reads every value as text; pybind's own message would not say which one was wrong).
DicommBackend::Settings settings_from(const py::dict& given) {
  DicommBackend::Settings settings;
  for (const auto& [name, value] : given) {
    if (!py::isinstance<py::str>(name) || !py::isinstance<py::str>(value))
      throw py::type_error("DicommBackend.Options: settings map variable names to text, got " +
                           py::repr(name).cast<std::string>() + ": " + py::repr(value).cast<std::string>() +
                           " (write numbers as strings, e.g. '65536')");
    settings[name.cast<std::string>()] = value.cast<std::string>();
  }
  return settings;
}

}  // namespace

PYBIND11_MODULE(_C_torch, m) {
  m.doc() = "dicomm's torch.distributed backend (a c10d::Backend over the dicomm engine)";
  py::module_::import("torch.distributed");  // registers c10d's classes before ours derive from them
  py::object classes = py::module_::import("dicomm.errors").attr("BACKEND_ERRORS");
  const char* names[] = {"generic", "timeout", "peer", "mismatch", "value"};
  for (int i = 0; i < 5; ++i) g_classes[i] = classes[names[i]].ptr();  // held by dicomm.errors

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const BackendError& e) {
      PyErr_SetString(class_for(e.kind), e.what_without_backtrace());
    }
  });

  py::class_<DicommBackend, c10d::Backend, c10::intrusive_ptr<DicommBackend>> backend(m, "DicommBackend");
  using DicommOptions = DicommBackend::DicommOptions;
  py::class_<DicommOptions, c10d::Backend::Options, c10::intrusive_ptr<DicommOptions>>(
      backend, "Options",
      "The backend's options: name, timeout and settings (knobs of docs/dicomm-config.md by variable name, "
      "for the group's communicator). Pass as pg_options to init_process_group or new_group; "
      "split_group copies the parent's.")
      .def(py::init([](const py::dict& settings) {
             return c10::make_intrusive<DicommOptions>(::kBackendDefaultTimeout, settings_from(settings));
           }),
           py::arg("settings") = py::dict())
      .def_property(
          "settings", [](const DicommOptions& o) { return o.settings; },
          [](DicommOptions& o, const py::dict& settings) { o.settings = settings_from(settings); },
          "Knobs by variable name, e.g. {'DICOMM_COLL_CHUNK_BYTES': '65536'} (reading gives a copy: "
          "assign a whole dict); the environment overrides them; checked when the group's "
          "communicator is created.")
      .def("__copy__", [](const DicommOptions& o) { return c10::make_intrusive<DicommOptions>(o); })
      .def("__deepcopy__", [](const DicommOptions& o, const py::dict&) { return c10::make_intrusive<DicommOptions>(o); },
           py::arg("memo"));
  backend
      .def_property_readonly("options", &DicommBackend::getBackendOptions,
                             "A fresh copy of the options (torch's split_group reads and copies them).")
      .def_property_readonly("timeout_s", [](const DicommBackend& b) { return b.timeout().count() / 1000.0; })
      .def("transport_of", [](DicommBackend& b, int peer) { return b.communicator().transport_of(peer); },
           py::arg("peer"), py::call_guard<py::gil_scoped_release>(),
           "Transport serving `peer`: self, shm, tcp or verbs; empty before first contact.")
      .def("stats", [](DicommBackend& b) { return b.communicator().stats(); },
           py::call_guard<py::gil_scoped_release>(), "The engine's counters for this group.")
      // torch's new_group calls this on the ranks a split leaves out when the default group is
      // bound to a device and its backend can split (NCCL's ncclCommSplit needs every parent
      // rank); a dicomm split is bootstrapped by its members alone, so there is nothing to do.
      .def("perform_nocolor_split", [](DicommBackend&, const py::object&) {}, py::arg("device"),
           "Nothing to do: the ranks a split leaves out take no part in it.");

  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         std::map<std::string, std::string> settings) {
        if (!(timeout_s > 0)) throw BackendError(Kind::kValue, "dicomm: the group timeout must be positive");
        py::gil_scoped_release release;
        return DicommBackend::create(
            store, rank, size, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0 + 0.5)),
            std::move(settings));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
      py::arg("settings") = std::map<std::string, std::string>{},
      "A dicomm backend for rank `rank` of `size`, bootstrapped through `store`, its communicator "
      "configured with `settings` (then the environment).");

  py::module_::import("atexit").attr("register")(py::cpp_function([] { close_all_at_exit(); }));
}
