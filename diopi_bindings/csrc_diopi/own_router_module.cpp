// The Python face of own_router.h in diopi_bindings._C_diopi: set-up hands over the plans (one dict per ATen overload,
// built by diopi_bindings/device/native_router.py), and the counters come back.
#include <torch/csrc/utils/pybind.h>

#include <map>

#include "own_router.h"

namespace py = pybind11;

namespace diopi_bindings {

namespace {

OwnForm form_of(const std::string& form) {
  if (form == "functional") return OwnForm::kFunctional;
  if (form == "inplace") return OwnForm::kInplace;
  TORCH_CHECK(form == "out", "diopi: unknown form '", form, "' (expected functional, inplace or out)");
  return OwnForm::kOut;
}

OwnKind kind_of(const std::string& kind) {
  static const std::map<std::string, OwnKind> kinds = {
      {"out", OwnKind::kOut}, {"out?", OwnKind::kOutOptional}, {"inout", OwnKind::kInout},
      {"out*", OwnKind::kOutAllocated}, {"in", OwnKind::kIn}, {"in?", OwnKind::kInOptional},
      {"in[]", OwnKind::kInList}, {"in?[]", OwnKind::kInOptionalList}, {"double", OwnKind::kDouble},
      {"int", OwnKind::kInt}, {"bool", OwnKind::kBool}, {"ints", OwnKind::kInts}};
  const auto it = kinds.find(kind);
  TORCH_CHECK(it != kinds.end(), "diopi: unknown ABI argument kind '", kind,
              "' (expected out, out?, inout, out*, in, in?, in[], in?[], double, int, bool or ints)");
  return it->second;
}

OwnDefault default_of(const std::string& name) {
  if (name.empty()) return OwnDefault::kNone;
  if (name == "zero") return OwnDefault::kZero;
  if (name == "dtype_eps") return OwnDefault::kDtypeEps;
  if (name == "rsqrt_last") return OwnDefault::kRsqrtLast;
  if (name == "-inf") return OwnDefault::kMinusInf;
  TORCH_CHECK(name == "inf", "diopi: unknown default '", name, "'");
  return OwnDefault::kPlusInf;
}

OwnRoute route_of(const py::dict& plan) {
  OwnRoute route;
  route.overload = plan["overload"].cast<std::string>();
  route.counted_as = plan["counted_as"].cast<std::string>();
  route.call = plan["call"].cast<size_t>();
  route.function = plan["function"].cast<uintptr_t>();
  route.form = form_of(plan["form"].cast<std::string>());
  route.masked_select = plan["masked_select"].cast<bool>();
  for (const py::handle item : plan["args"]) {
    const auto t = item.cast<py::tuple>();
    route.args.push_back({kind_of(t[0].cast<std::string>()), t[1].cast<int>(), default_of(t[2].cast<std::string>()),
                          t[3].cast<int>()});
  }
  route.targets = plan["targets"].cast<std::vector<int>>();
  route.mask_indices = plan["mask_indices"].cast<int>();
  route.mask_base = plan["mask_base"].cast<int>();
  route.nonzero = plan["nonzero"].cast<bool>();
  route.dropout = plan["dropout"].cast<int>();
  route.attn_mask = plan["attn_mask"].cast<int>();
  return route;
}

py::dict as_dict(const std::vector<std::pair<std::string, int64_t>>& counts) {
  py::dict out;
  for (const auto& [name, n] : counts) out[py::str(name)] = n;
  return out;
}

}  // namespace

void bind_own_routes(py::module& m) {
  m.def("register_own_routes", [](const py::list& plans, uintptr_t last_error, py::function log) {
    std::vector<OwnRoute> routes;
    for (const py::handle plan : plans) routes.push_back(route_of(plan.cast<py::dict>()));
    // Leaked on purpose: called from any thread for as long as the process lives, never destroyed at exit.
    auto* callback = new py::object(std::move(log));
    return register_own_routes(routes, last_error, [callback](const std::string& name, const std::string& reason) {
      py::gil_scoped_acquire gil;
      try {
        (*callback)(name, reason);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("diopi: the own-ABI router's log");
      }
    });
  }, py::arg("plans"), py::arg("last_error"), py::arg("log"),
        "Route ATen overloads to the own-ABI library in C++, one plan (a dict) each; log(overload, reason) is called "
        "the first time an overload falls back. Returns a handle for drop_own_routes.");
  m.def("drop_own_routes", &drop_own_routes, py::arg("handle"), "Unregister the kernels of register_own_routes.");
  m.def("own_routed_counts", []() { return as_dict(own_routed_counts()); },
        "ATen overload -> calls the own-ABI library served.");
  m.def("own_fallback_counts", []() { return as_dict(own_fallback_counts()); },
        "ATen overload -> calls of the own-ABI routes run on the CPU (declined, or arguments the ABI cannot carry).");
  m.def("own_operand_copies", &own_operand_copies, "CPU tensors moved to the device as an own-ABI call's operands.");
}

}  // namespace diopi_bindings
