// The `dicomm._C` module: error classes, the store adapter, the Communicator's point-to-point
// methods and Request. Every call into the engine releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/communicator.h"
#include "core/config.h"
#include "core/live_set.h"
#include "core/hmac.h"
#include "core/p2p_request.h"
#include "core/types.h"
#include "python/bindings.h"
#include "python/native_p2p.h"
#include "transport/registry.h"
#include "transport/verbs/accel.h"
#include "transport/verbs/device.h"

namespace py = pybind11;

namespace dicomm::python {
namespace {

PyObject* g_error = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_peer = nullptr;
PyObject* g_mismatch = nullptr;
PyObject* g_value = nullptr;

void define_errors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("dicomm._C.DicommError", "Any dicomm failure.", PyExc_RuntimeError, nullptr);
  g_timeout = PyErr_NewExceptionWithDoc("dicomm._C.TimeoutError", "A wait outlived its timeout.", g_error, nullptr);
  g_peer = PyErr_NewExceptionWithDoc("dicomm._C.PeerError", "A peer died, a connection broke, or the communicator was aborted.", g_error, nullptr);
  g_mismatch = PyErr_NewExceptionWithDoc("dicomm._C.MismatchError", "A message larger than the buffer, or metas that differ.", g_error, nullptr);
  PyObject* bases = PyTuple_Pack(2, g_error, PyExc_ValueError);
  g_value = PyErr_NewExceptionWithDoc("dicomm._C.ValueError", "A bad argument (rank, dtype, size...).", bases, nullptr);
  Py_DECREF(bases);
  m.attr("DicommError") = py::handle(g_error);
  m.attr("TimeoutError") = py::handle(g_timeout);
  m.attr("PeerError") = py::handle(g_peer);
  m.attr("MismatchError") = py::handle(g_mismatch);
  m.attr("ValueError") = py::handle(g_value);
  // NOLINTNEXTLINE(performance-unnecessary-value-param): the signature pybind11 requires
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ValueError& e) { PyErr_SetString(g_value, e.what());
    } catch (const TimeoutError& e) { PyErr_SetString(g_timeout, e.what());
    } catch (const PeerError& e) { PyErr_SetString(g_peer, e.what());
    } catch (const MismatchError& e) { PyErr_SetString(g_mismatch, e.what());
    } catch (const Error& e) { PyErr_SetString(g_error, e.what());
    }
  });
}

// Adapts a Python store (torch's c10d Store: set / get / wait / add / check) to the engine's Store.
class PyStore : public Store {
 public:
  explicit PyStore(py::object store) : store_(std::move(store)) {}
  ~PyStore() override {
    if (!Py_IsInitialized()) {  // at interpreter teardown: leak rather than touch Python
      store_.release();
      return;
    }
    try {
      py::gil_scoped_acquire gil;
      store_ = py::object();
    } catch (...) {  // a destructor must not throw: at worst the store object leaks
    }
  }

  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    store_.attr("set")(key, py::bytes(value));
  }

  int64_t add(const std::string& key, int64_t delta) override {
    py::gil_scoped_acquire gil;
    try {
      return store_.attr("add")(key, delta).cast<int64_t>();
    } catch (py::error_already_set& e) {
      throw Error("store error on key '" + key + "': " + e.what());
    }
  }

  bool check(const std::string& key) override {
    py::gil_scoped_acquire gil;
    try {
      py::list keys;
      keys.append(key);
      return store_.attr("check")(keys).cast<bool>();
    } catch (py::error_already_set& e) {
      throw Error("store error on key '" + key + "': " + e.what());
    }
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    try {
      auto timedelta = py::module_::import("datetime").attr("timedelta");
      py::list keys;
      keys.append(key);
      store_.attr("wait")(keys, timedelta(py::arg("milliseconds") = timeout.count()));
      return store_.attr("get")(key).cast<std::string>();
    } catch (py::error_already_set& e) {
      std::string what = e.what();
      bool timed_out = what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos;
      if (timed_out)
        throw TimeoutError("timed out after " + std::to_string(timeout.count()) + " ms waiting for store key '" + key + "'");
      throw Error("store error on key '" + key + "': " + what);
    }
  }

 private:
  py::object store_;
};

// Communicators still open at interpreter exit are closed by an atexit hook.
LiveSet<std::weak_ptr<Communicator>> g_live;

void close_all_at_exit() {
  auto live = g_live.take();
  py::gil_scoped_release release;
  for (auto& c : live) c->close();
}

std::chrono::milliseconds to_ms(double seconds) {
  if (!(seconds >= 0)) throw ValueError("timeout must be a non-negative number of seconds");
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

Tag user_tag(int64_t tag) {
  if (tag < 0) throw ValueError("tag " + std::to_string(tag) + " is negative; tags are integers in [0, 2**63)");
  return static_cast<Tag>(tag);  // < 2**63 by type: the top bit stays reserved for collectives
}

}  // namespace
}  // namespace dicomm::python

PYBIND11_MODULE(_C, m) {
  using namespace dicomm;
  using namespace dicomm::python;
  m.doc() = "dicomm engine: tag-matched point-to-point over shared memory, TCP and RDMA verbs, and collectives";
  define_errors(m);

  py::class_<Request, RequestPtr>(m, "Request")
      .def("test", &Request::test, py::call_guard<py::gil_scoped_release>(),
           "True once done; raises the operation's error if it failed.")
      .def(
          "wait",
          [](Request& r, std::optional<double> timeout_s) {
            std::chrono::milliseconds timeout = std::chrono::minutes(30);
            if (timeout_s) timeout = to_ms(*timeout_s);
            else if (auto* t = dynamic_cast<HasDefaultTimeout*>(&r)) timeout = t->default_timeout();
            py::gil_scoped_release release;
            r.wait(timeout);
          },
          py::arg("timeout_s") = py::none(),
          "Blocks until done (None: the communicator's timeout); raises TimeoutError naming op, peer, tag and\n"
          "bytes. A receive still unmatched at the timeout is withdrawn (its buffer is never written after);\n"
          "anything already moving keeps going. Use test() to poll.")
      .def_property_readonly("source", &Request::source)
      .def_property_readonly("nbytes", &Request::nbytes)
      .def("describe", &Request::describe)
      .def("__repr__", [](const Request& r) { return "<dicomm Request " + r.describe() + ">"; });

  CommClass comm(m, "Communicator");
  comm.def(py::init([](py::object store, int rank, int size, double timeout_s, std::string transport,
                       std::map<std::string, std::string> settings) {
             Options options;
             options.timeout = to_ms(timeout_s);
             options.transport = std::move(transport);
             options.settings = std::move(settings);
             auto adapter = std::make_shared<PyStore>(std::move(store));
             std::shared_ptr<Communicator> c;
             {
               py::gil_scoped_release release;
               // Destruction joins the collective thread, which may be waiting for the GIL (the
               // store adapter): never destroy while holding it.
               c = std::shared_ptr<Communicator>(new Communicator(adapter, rank, size, options), [](Communicator* p) {
                 if (Py_IsInitialized() && PyGILState_Check()) {
                   py::gil_scoped_release unlocked;
                   delete p;
                 } else {
                   delete p;
                 }
               });
             }
             g_live.add(c);
             return c;
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s") = 1800.0,
           py::arg("transport") = "auto", py::arg("settings") = std::map<std::string, std::string>{},
           "settings: knobs of docs/dicomm-config.md for this communicator, by variable name (the "
           "environment overrides them)")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("timeout_s", [](const Communicator& c) { return static_cast<double>(c.timeout().count()) / 1000.0; })
      .def(
          "isend",
          [](Communicator& c, uintptr_t ptr, size_t nbytes, int peer, int64_t tag, uint64_t meta) {
            Tag t = user_tag(tag);
            py::gil_scoped_release release;
            return c.isend(reinterpret_cast<const void*>(ptr), nbytes, peer, t, meta);
          },
          py::arg("ptr"), py::arg("nbytes"), py::arg("peer"), py::arg("tag"), py::arg("meta") = 0)
      .def(
          "irecv",
          [](Communicator& c, uintptr_t ptr, size_t nbytes, int peer, int64_t tag, uint64_t meta) {
            Tag t = user_tag(tag);
            py::gil_scoped_release release;
            return c.irecv(reinterpret_cast<void*>(ptr), nbytes, peer, t, meta);
          },
          py::arg("ptr"), py::arg("nbytes"), py::arg("peer"), py::arg("tag"), py::arg("meta") = 0)
      .def("transport_of", &Communicator::transport_of, py::arg("peer"), py::call_guard<py::gil_scoped_release>())
      .def("stats", &Communicator::stats, py::call_guard<py::gil_scoped_release>())
      .def("abort", &Communicator::abort, py::arg("reason"), py::call_guard<py::gil_scoped_release>())
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>());

  bind_collectives(m, comm);

  static const NativeP2P native_p2p = [] {
    NativeP2P t;
    t.unwrap = [](PyObject* obj) -> Communicator* {
      try {
        return &py::cast<Communicator&>(py::handle(obj));
      } catch (const py::cast_error&) {
        throw ValueError(std::string("expected a dicomm._C.Communicator, got ") + Py_TYPE(obj)->tp_name);
      }
    };
    t.rank = [](const Communicator& c) { return c.rank(); };
    t.isend = [](Communicator& c, const void* buf, size_t bytes, int peer, Tag tag) { return c.isend(buf, bytes, peer, tag); };
    t.irecv = [](Communicator& c, void* buf, size_t bytes, int peer, Tag tag) { return c.irecv(buf, bytes, peer, tag); };
    return t;
  }();
  m.attr("_native_p2p") = py::capsule(&native_p2p, NativeP2P::kCapsuleName);

  m.def("_config_knobs", [] {
    std::vector<std::map<std::string, std::string>> out;
    for (const auto& k : knobs())
      out.push_back({{"name", k.name}, {"default", k.fallback}, {"form", k.form()}, {"unit", k.unit}, {"meaning", k.meaning}});
    return out;
  }, "Every DICOMM_* setting the engine reads: name, default ('' for none), expected form, unit, meaning.");

  m.def("_register_transport", [](const py::capsule& factory) {
    if (std::string(factory.name() ? factory.name() : "") != transport::kTransportFactoryCapsule)
      throw ValueError(std::string("expected a capsule named ") + transport::kTransportFactoryCapsule + ", got '" +
                       (factory.name() ? factory.name() : "") + "'");
    transport::register_transport(*factory.get_pointer<transport::TransportFactory>());
  }, py::arg("factory"),
     "Registers a transport built in another extension module (a capsule named\n"
     "'dicomm.TransportFactory/1' holding a dicomm::transport::TransportFactory); communicators created\n"
     "afterwards open it, and DICOMM_TRANSPORT / transport= may name it.");

  m.def("_hmac_sha256", [](const py::bytes& key, const py::bytes& message) {
    std::string k = key, msg = message;
    Digest d = hmac_sha256(k, msg.data(), msg.size());
    return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
  }, py::arg("key"), py::arg("message"), "Test hook: the handshake's HMAC-SHA-256 of `message` under `key`.");

  m.def("_verbs_probe", [](std::map<std::string, std::string> settings) {
    namespace verbs = transport::verbs;
    Options options;
    options.settings = std::move(settings);
    const EngineConfig config = EngineConfig::load(options);  // as a communicator given `settings` reads it
    std::string why;
    const verbs::AccelCaps& caps = verbs::Accel::get().caps();
    verbs::DevicePath path = verbs::decide_path(caps, &why);
    auto q = [](const std::string& s) { return py::module_::import("json").attr("dumps")(s).cast<std::string>(); };
    return "{\"verbs\": " + verbs::probe_json(config) + ", \"accelerator\": {\"driver\": " + (caps.driver ? "true" : "false") +
           ", \"path\": " + q(verbs::device_path_name(path)) + ", \"why\": " + q(why) + "}}";
  }, py::arg("settings") = std::map<std::string, std::string>{},
     "JSON text: RDMA devices, ports, GID tables and the GID a communicator given `settings` (then the\n"
     "environment, as Communicator reads them) would choose, and how accelerator memory would reach the NIC\n"
     "(device-direct or CPU-mediated) as far as known before a device buffer is seen.");

  // Exercises the accelerator half of device-direct RDMA and of CPU-mediated staging on a fresh thread (as
  // the progress thread would): no NIC is needed, so a GPU host without RDMA still checks it.
  m.def("_accel_check", [](uintptr_t device_ptr, uintptr_t host_ptr, size_t nbytes, bool to_device) {
    namespace verbs = transport::verbs;
    std::map<std::string, long long> out;
    std::string error;
    {
      py::gil_scoped_release nogil;
      std::thread t([&] {
        try {
          verbs::Accel& a = verbs::Accel::get();
          auto* dev = reinterpret_cast<void*>(device_ptr);
          auto* host = reinterpret_cast<void*>(host_ptr);
          out["driver"] = a.caps().driver;
          out["device_is_device"] = a.is_device(dev);
          out["host_is_device"] = a.is_device(host);
          uint64_t off = 0;
          int fd = a.export_dmabuf(dev, nbytes, &off);
          out["dmabuf_fd"] = fd;
          out["dmabuf_offset"] = fd >= 0 ? static_cast<long long>(off) : -1;
          out["dmabuf_size"] = fd >= 0 ? static_cast<long long>(lseek(fd, 0, SEEK_END)) : -1;
          if (fd >= 0) close(fd);
          if (to_device) a.copy_to_device(dev, host, nbytes);
          else a.copy_to_host(host, dev, nbytes);
        } catch (const std::exception& e) {
          error = e.what();
        }
      });
      t.join();
    }
    if (!error.empty()) throw std::runtime_error(error);
    return out;
  }, py::arg("device_ptr"), py::arg("host_ptr"), py::arg("nbytes"), py::arg("to_device") = false,
     "Test hook: pointer classification, dma-buf export of the device buffer's allocation, and one staging\n"
     "copy (device -> host, or host -> device with to_device) from a thread that never touched the device.");

  py::module_::import("atexit").attr("register")(py::cpp_function([] { close_all_at_exit(); }));
}
