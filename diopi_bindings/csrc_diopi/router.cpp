// The boxed kernel every routed ATen overload gets on PrivateUse1: result shapes and dtypes from the meta
// kernel, results allocated on the device, the library's DIOPI function called through the generated
// trampoline, and the CPU (at::native::cpu_fallback) where the library answers diopiNoImplement,
// diopiForceFallbackToCPU or diopiDtypeNotSupported. Counts per overload: calls the library served, calls
// that fell back.
#include "router.h"

#include <ATen/ATen.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "frame.h"

namespace diopi_bindings {

namespace {

struct Counts {
  std::atomic<int64_t> routed{0};
  std::atomic<int64_t> fallback{0};
};

std::vector<void*> g_functions;          // per route: the library's function, or null
std::unique_ptr<Counts[]> g_counts;
const char* (*g_last_error)() = nullptr;

c10::IValue to_meta(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return v;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(to_meta(t).toTensor());
    return c10::IValue(list);
  }
  return v;
}

c10::Device device_of(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().device().is_privateuseone()) {
      return stack[i].toTensor().device();
    }
  }
  return c10::Device(c10::DeviceType::PrivateUse1, 0);
}

c10::ScalarType first_device_dtype(const torch::jit::Stack& stack, size_t first, size_t n, c10::ScalarType otherwise) {
  for (size_t i = first; i < first + n; ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().device().is_privateuseone()) {
      return stack[i].toTensor().scalar_type();
    }
  }
  return otherwise;
}

// The written argument a return aliases (an in-place self, an out= tensor).
size_t written_argument(const c10::FunctionSchema& schema, const c10::AliasInfo& alias) {
  const auto& args = schema.arguments();
  for (size_t j = 0; j < args.size(); ++j) {
    if (args[j].alias_info() != nullptr && args[j].alias_info()->isWrite() &&
        args[j].alias_info()->beforeSets() == alias.beforeSets()) {
      return j;
    }
  }
  TORCH_CHECK(false, "diopi: ", schema.name(), " returns an alias of no written argument");
}

class DiopiKernel final : public c10::OperatorKernel {
 public:
  explicit DiopiKernel(size_t index) : index_(index) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const Route& route = kRoutes[index_];
    const c10::FunctionSchema& schema = op.schema();
    const size_t n = schema.arguments().size();
    const size_t first = stack->size() - n;

    torch::jit::Stack meta;
    meta.reserve(n);
    for (size_t i = first; i < stack->size(); ++i) meta.push_back(to_meta((*stack)[i]));
    op.callBoxed(meta);

    const c10::Device device = device_of(*stack, first);
    std::vector<at::Tensor> outs;
    outs.reserve(schema.returns().size());
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      const at::Tensor& shape = meta.at(r).toTensor();
      const c10::AliasInfo* alias = schema.returns()[r].alias_info();
      if (alias != nullptr) {
        at::Tensor& target = (*stack)[first + written_argument(schema, *alias)].toTensor();
        if (target.sizes() != shape.sizes()) target.resize_(shape.sizes());
        outs.push_back(target);
      } else {
        outs.push_back(at::empty_strided(shape.sizes(), shape.strides(), shape.options().device(device)));
      }
    }

    // A Python number arrives as a 0-dim CPU tensor (int64 or float64); a library sees it as a device tensor
    // of the dtype of the operator's first device tensor, as type promotion treats it.
    for (size_t i = first; i < first + n; ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
        v = v.toTensor().to(device, first_device_dtype(*stack, first, n, v.toTensor().scalar_type()));
      }
    }
    diopiContext ctx;
    ctx.device = device;
    Frame frame(&ctx, *stack, first, outs);
    const diopiError_t code = route.call(g_functions[index_], frame);
    if (code == diopiNoImplement || code == diopiForceFallbackToCPU || code == diopiDtypeNotSupported) {
      g_counts[index_].fallback.fetch_add(1, std::memory_order_relaxed);
      at::native::cpu_fallback(op, stack);
      return;
    }
    if (code != diopiSuccess) {
      const char* message = g_last_error != nullptr ? g_last_error() : nullptr;
      TORCH_CHECK(false, "diopi: ", route.diopi, " (", route.name, route.overload[0] ? "." : "", route.overload,
                  ") failed with error ", static_cast<int>(code), ": ", message != nullptr ? message : "(no message)");
    }
    for (size_t r = 0; r < outs.size(); ++r) {  // results the library allocated itself
      if (const at::Tensor* made = frame.result(r)) {
        if (schema.returns()[r].alias_info() != nullptr) {
          outs[r].resize_(made->sizes()).copy_(*made);
        } else {
          outs[r] = *made;
        }
      }
    }
    g_counts[index_].routed.fetch_add(1, std::memory_order_relaxed);
    torch::jit::drop(*stack, n);
    for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  }

 private:
  size_t index_;
};

}  // namespace

std::vector<std::string> register_routes(void* library, const char* (*last_error)()) {
  static std::once_flag once;
  bool first = false;
  std::call_once(once, [&] { first = true; });
  TORCH_CHECK(first, "diopi: a DIOPI library is already attached in this process");
  g_last_error = last_error;
  g_functions.assign(kRouteCount, nullptr);
  g_counts = std::make_unique<Counts[]>(kRouteCount);
  // Leaked on purpose: the registrations live as long as the process (the library stays loaded).
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  std::vector<std::string> routed;
  for (size_t i = 0; i < kRouteCount; ++i) {
    g_functions[i] = dlsym(library, kRoutes[i].diopi);
    if (g_functions[i] == nullptr) continue;  // the device's other path serves it
    std::string name = std::string(kRoutes[i].name).substr(6);  // without "aten::"
    if (kRoutes[i].overload[0] != '\0') name += std::string(".") + kRoutes[i].overload;
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<DiopiKernel>(i)));
    routed.push_back(std::string(kRoutes[i].name) + (kRoutes[i].overload[0] ? "." : "") + kRoutes[i].overload);
  }
  return routed;
}

std::vector<RouteCount> route_counts() {
  std::vector<RouteCount> out;
  if (!g_counts) return out;
  for (size_t i = 0; i < kRouteCount; ++i) {
    const int64_t routed = g_counts[i].routed.load(std::memory_order_relaxed);
    const int64_t fallback = g_counts[i].fallback.load(std::memory_order_relaxed);
    if (routed == 0 && fallback == 0) continue;
    out.push_back({std::string(kRoutes[i].name) + (kRoutes[i].overload[0] ? "." : "") + kRoutes[i].overload,
                   kRoutes[i].diopi, routed, fallback});
  }
  return out;
}

}  // namespace diopi_bindings
