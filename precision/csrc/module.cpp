// The `ditorch_precision._C` module: the fused statistics pass and the C++ op observer of a stats
// capture. Built against torch's own pybind11, so tensors and dtypes cross as torch's objects.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "fused_stats.h"
#include "op_observer.h"

namespace py = pybind11;
using ditorch_precision::FusedStats;
using ditorch_precision::OpObserver;
using ditorch_precision::Record;

namespace {

// A Python callable the observer calls from ops on any thread: each call takes the GIL, and so does
// the release.
std::shared_ptr<py::function> held(py::function f) {
  return std::shared_ptr<py::function>(new py::function(std::move(f)), [](py::function* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// A transfer's record as records.OpRecord.to_dict writes it (the C++ hook records no call sites).
py::dict op_record(const Record& r) {
  py::dict d;
  d["index"] = r.index;
  d["op"] = r.op->shown_name;
  d["overload"] = r.op->shown_overload;
  d["phase"] = r.phase;
  d["module"] = r.module == nullptr || r.module->empty() ? py::object(py::none()) : py::str(*r.module);
  d["step"] = r.step;
  d["rank"] = r.rank;
  d["callsite"] = py::none();
  d["api"] = py::none();
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ditorch_precision's C++ parts: fused tensor statistics and the op observer of a stats capture";

  m.def(
      "fused_stats",
      [](const at::Tensor& t) -> py::object {
        FusedStats s;
        {
          py::gil_scoped_release release;
          s = ditorch_precision::fused_stats(t);
        }
        if (!s.supported) return py::none();
        return py::make_tuple(s.numel, s.nan, s.inf, s.finite, s.lo, s.hi, s.sum, s.sumsq);
      },
      py::arg("tensor"),
      "(numel, nan, inf, finite, min, max, sum, sum of squares) of a strided CPU tensor of a floating or "
      "integer dtype, in one pass with float64 accumulators (min .. sum of squares over the finite values); "
      "None for any other tensor");

  py::class_<OpObserver>(m, "OpObserver")
      .def(py::init<>())
      .def("start", [](OpObserver& o) {
        if (OpObserver::current() != nullptr && OpObserver::current() != &o)
          throw std::runtime_error("another C++ op observer is active; one C++-hooked capture at a time");
        o.start();
      })
      .def("stop", &OpObserver::stop)
      .def("tag", &OpObserver::tag)
      .def("push_module", &OpObserver::push_module)
      .def("pop_module", &OpObserver::pop_module)
      .def("set_optimizer", &OpObserver::set_optimizer)
      .def("set_step", &OpObserver::set_step)
      .def("set_rank", &OpObserver::set_rank)
      .def("pause", &OpObserver::pause)
      .def("resume", &OpObserver::resume)
      .def("module_record", &OpObserver::module_record)
      .def("open_index", &OpObserver::open_index, py::arg("path"), py::arg("max_queued"))
      .def("drain", &OpObserver::drain, py::call_guard<py::gil_scoped_release>())
      .def("close_index", &OpObserver::close_index, py::call_guard<py::gil_scoped_release>())
      .def("waits", &OpObserver::waits)
      .def("set_group", &OpObserver::set_group)
      .def("set_reduce_op_name", &OpObserver::set_reduce_op_name)
      .def(
          "set_python_side",
          [](OpObserver& o, py::function readable, py::function group_ranks) {
            auto r = held(std::move(readable)), g = held(std::move(group_ranks));
            o.set_python_side(
                [r](const at::Tensor& t) {
                  py::gil_scoped_acquire gil;
                  return (*r)(t).cast<at::Tensor>();
                },
                [g](const std::string& name) {
                  py::gil_scoped_acquire gil;
                  py::object ranks = (*g)(name);
                  return ranks.is_none() ? std::vector<int64_t>{} : ranks.cast<std::vector<int64_t>>();
                });
          },
          py::arg("readable"), py::arg("group_ranks"),
          "readable(tensor) -> the plain tensor holding a Python wrapper subclass's elements; "
          "group_ranks(name) -> a process group's global ranks or None; both called under the GIL")
      .def(
          "set_transfers",
          [](OpObserver& o, py::function transfer, py::function touched) {
            auto t = held(std::move(transfer)), u = held(std::move(touched));
            o.set_transfers(
                [t](const Record& r, const std::vector<c10::IValue>& args, const c10::IValue& out) {
                  py::gil_scoped_acquire gil;
                  py::tuple py_args(args.size());
                  for (size_t i = 0; i < args.size(); ++i) py_args[i] = torch::jit::toPyObject(args[i]);
                  py::object group = r.group.empty() ? py::object(py::none()) : py::cast(r.group);
                  py::object unread = (*t)(op_record(r), py_args, group, torch::jit::toPyObject(out));
                  return unread.cast<std::vector<int64_t>>();
                },
                [u](const std::vector<at::Tensor>& tensors) {
                  py::gil_scoped_acquire gil;
                  return (*u)(tensors).cast<std::vector<int64_t>>();
                });
          },
          py::arg("transfer"), py::arg("touched"),
          "transfer(record, args, group, out) -> storages of the received buffers not read yet: a send "
          "(out None) before it is issued, a receive once issued; touched(tensors) -> the same, before an op "
          "(not a view) on the storage of such a buffer; both called under the GIL")
      .def("set_full", &OpObserver::set_full, py::arg("parts_dir"), py::arg("part_bytes"), py::arg("max_bytes"),
           py::arg("max_queued_bytes"))
      .def("bytes_written", &OpObserver::bytes_written)
      .def("dropped", &OpObserver::dropped)
      .def("parts", &OpObserver::parts)
      .def("write_waits", &OpObserver::write_waits)
      .def("count", &OpObserver::count)
      .def("elements_read", &OpObserver::elements_read)
      .def("set_dtype_name", &OpObserver::set_dtype_name);
}
