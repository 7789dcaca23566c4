// The boxed kernel every routed ATen overload gets on PrivateUse1: result shapes and dtypes from the meta
// kernel, results allocated on the device, the library's DIOPI function called through the generated
// trampoline, and the CPU (the device's fallback, cpu_fallback.h) where the library answers diopiNoImplement,
// diopiForceFallbackToCPU or diopiDtypeNotSupported. Counts per overload: calls the library served, calls
// that fell back.
#include "router.h"

#include <ATen/ATen.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cpu_fallback.h"
#include "frame.h"
#include "mask_indices.h"

namespace diopi_bindings {

namespace {

struct Counts {
  std::atomic<int64_t> routed{0};
  std::atomic<int64_t> fallback{0};
};

std::vector<void*> g_functions;          // per route: the library's function, or null
std::unique_ptr<Counts[]> g_counts;
const char* (*g_last_error)() = nullptr;

c10::Device device_of(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().device().is_privateuseone()) {
      return stack[i].toTensor().device();
    }
  }
  return c10::Device(c10::DeviceType::PrivateUse1, 0);
}

// The dtype a Python number (a wrapped 0-dim tensor) takes: torch's result type of the operator's device tensors
// that it reads and the number, which ranks below them (int8 + 2.5 is float32, float16 + 2.5 float16).
c10::ScalarType promoted_dtype(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                               const at::Tensor& number) {
  at::native::ResultTypeState state{};
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const c10::IValue& v = stack[first + i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone() &&
        (alias == nullptr || !alias->isWrite())) {
      state = at::native::update_result_type_state(v.toTensor(), state);
    }
  }
  return at::native::result_type(at::native::update_result_type_state(number, state));
}

// Result shapes, strides and dtypes come from the meta kernel, which for many operators is Python
// (torch._refs): cached (result_meta). Float arguments are left out of the key (a learning rate changes every step
// and never a shape), except for an operator whose only tensors are its outputs (arange: its bounds make its size).
using MetaKey = std::vector<int64_t>;
struct MetaKeyHash {
  size_t operator()(const MetaKey& key) const noexcept {
    size_t h = 1469598103934665603ull;
    for (int64_t v : key) h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};
std::mutex g_meta_mutex;
std::unordered_map<MetaKey, std::vector<ResultMeta>, MetaKeyHash> g_meta_cache;
constexpr size_t kMetaCacheLimit = 1 << 16;

void key_tensor(MetaKey& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(t.dim());
  key.insert(key.end(), t.sizes().begin(), t.sizes().end());
  key.insert(key.end(), t.strides().begin(), t.strides().end());
  key.push_back(static_cast<int64_t>(t.scalar_type()) * 64 + static_cast<int64_t>(t.device().type()) * 2 +
                (t.unsafeGetTensorImpl()->is_wrapped_number() ? 1 : 0));
}

MetaKey meta_key(int64_t route, const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  const size_t n = schema.arguments().size();
  bool reads_a_tensor = false;
  for (size_t i = 0; i < n; ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (stack[first + i].isTensor() && (alias == nullptr || !alias->isWrite())) reads_a_tensor = true;
  }
  MetaKey key{route};
  for (size_t i = first; i < first + n; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      key_tensor(key, v.toTensor());
    } else if (v.isTensorList() || v.isList()) {
      const auto list = v.toListRef();
      key.push_back(-2);
      key.push_back(static_cast<int64_t>(list.size()));
      for (const c10::IValue& item : list) {
        if (item.isTensor()) key_tensor(key, item.toTensor());
        else if (item.isInt()) key.push_back(item.toInt());
        else key.push_back(item.isNone() ? -7 : -9);
      }
    } else if (v.isInt()) {
      key.push_back(-3);
      key.push_back(v.toInt());
    } else if (v.isDouble()) {
      key.push_back(-4);
      double d = reads_a_tensor ? 0.0 : v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(bits);
    } else if (v.isBool()) {
      key.push_back(v.toBool() ? -51 : -50);
    } else if (v.isNone()) {
      key.push_back(-7);
    } else if (v.isString()) {
      key.push_back(-8);
      key.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())));
    } else {
      key.push_back(-9);  // another kind (a dtype, a layout): by its tag
      key.push_back(static_cast<int64_t>(v.tagKind().size()));
    }
  }
  return key;
}

// The results of an out= overload whose own meta kernel refuses the out= keyword (torch's Python meta of
// embedding_dense_backward serves its autogenerated .out too, without an out parameter): the functional overload's
// meta results, as torch's own out= kernel of such an operator (the functional call copied into out) gets them.
// An out tensor of another dtype than its result's is refused, as torch's own kernel refuses it. False when the
// operator has no such functional overload in the table (the out= meta kernel's error is raised).
bool functional_meta(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                     torch::jit::Stack& meta) {
  std::vector<size_t> inputs, outs;
  for (size_t i = 0; i < schema.arguments().size(); ++i) (schema.arguments()[i].is_out() ? outs : inputs).push_back(i);
  if (outs.empty() || outs.size() != schema.returns().size()) return false;
  for (size_t r = 0; r < kRouteCount; ++r) {
    if (schema.name() != kRoutes[r].name) continue;
    const auto functional = c10::Dispatcher::singleton().findSchema({kRoutes[r].name, kRoutes[r].overload});
    if (!functional) continue;
    const c10::FunctionSchema& f = functional->schema();
    bool same = f.arguments().size() == inputs.size() && f.returns().size() == outs.size();
    for (size_t k = 0; same && k < inputs.size(); ++k) {
      const c10::Argument& a = schema.arguments()[inputs[k]];
      same = f.arguments()[k].name() == a.name() && *f.arguments()[k].type() == *a.type();
    }
    if (!same) continue;
    torch::jit::Stack call;
    for (size_t i : inputs) call.push_back(to_meta(stack[first + i]));
    try {
      functional->callBoxed(call);
    } catch (const std::exception&) {
      return false;
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      const c10::ScalarType want = call.at(k).toTensor().scalar_type();
      const c10::ScalarType got = stack[first + outs[k]].toTensor().scalar_type();
      TORCH_CHECK(want == got, schema.name(), ".", schema.overload_name(), ": expected out tensor to have dtype ", want,
                  ", but got ", got, " instead");
    }
    meta = std::move(call);
    return true;
  }
  return false;
}

}  // namespace

std::vector<ResultMeta> result_meta(const c10::OperatorHandle& op, int64_t route, const torch::jit::Stack& stack,
                                    size_t first) {
  const c10::FunctionSchema& schema = op.schema();
  MetaKey key = meta_key(route, schema, stack, first);
  {
    std::lock_guard<std::mutex> lock(g_meta_mutex);
    auto it = g_meta_cache.find(key);
    if (it != g_meta_cache.end()) return it->second;
  }
  torch::jit::Stack meta;
  meta.reserve(schema.arguments().size());
  for (size_t i = first; i < stack.size(); ++i) meta.push_back(to_meta(stack[i]));
  try {
    op.callBoxed(meta);
  } catch (const std::exception&) {  // c10::Error, or a Python meta kernel's error
    if (!functional_meta(schema, stack, first, meta)) throw;
  }
  std::vector<ResultMeta> out;
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    const c10::IValue& v = meta.at(r);
    if (!v.isTensor() || !v.toTensor().defined()) {  // an absent optional result
      out.push_back({false, {}, {}, c10::ScalarType::Undefined});
      continue;
    }
    const at::Tensor& t = v.toTensor();
    out.push_back({true, t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  std::lock_guard<std::mutex> lock(g_meta_mutex);
  if (g_meta_cache.size() >= kMetaCacheLimit) g_meta_cache.clear();
  g_meta_cache.emplace(std::move(key), out);
  return out;
}

namespace {

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
    expand_index_masks(schema, *stack, first);  // a mask's result shape needs its nonzero, which meta cannot give

    const std::vector<ResultMeta> metas = result_meta(op, static_cast<int64_t>(index_), *stack, first);
    const c10::Device device = device_of(*stack, first);
    std::vector<at::Tensor> outs;
    outs.reserve(schema.returns().size());
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      const ResultMeta& shape = metas[r];
      TORCH_CHECK(shape.defined, "diopi: ", schema.name(), " returned no result ", r, " from its meta kernel");
      const c10::AliasInfo* alias = schema.returns()[r].alias_info();
      if (alias != nullptr) {
        at::Tensor& target = (*stack)[first + written_argument(schema, *alias)].toTensor();
        if (target.sizes() != c10::IntArrayRef(shape.sizes)) target.resize_(shape.sizes);
        outs.push_back(target);
      } else {
        outs.push_back(at::empty_strided(shape.sizes, shape.strides, at::TensorOptions().dtype(shape.dtype).device(device)));
      }
    }

    // A Python number arrives as a 0-dim CPU tensor (int64 or float64); a library sees it as a device tensor
    // of the dtype type promotion gives it. The numbers are kept for a declined call: the CPU promotes them itself.
    std::vector<std::pair<size_t, c10::IValue>> numbers;
    for (size_t i = first; i < first + n; ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
        numbers.emplace_back(i, v);
        v = v.toTensor().to(device, promoted_dtype(schema, *stack, first, v.toTensor()));
      }
    }
    diopiContext ctx;
    ctx.device = device;
    // The calling thread's current stream of the device (the library's handle; NULL without streams).
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(device.type());
    ctx.stream = guard->getStreamNativeHandle(guard->getStream(device));
    Frame frame(&ctx, *stack, first, outs);
    const diopiError_t code = route.call(g_functions[index_], frame);
    if (code == diopiNoImplement || code == diopiForceFallbackToCPU || code == diopiDtypeNotSupported) {
      g_counts[index_].fallback.fetch_add(1, std::memory_order_relaxed);
      frame.release_generators();  // the fallback locks them again (a second lock by this thread would hang)
      for (auto& [i, number] : numbers) (*stack)[i] = std::move(number);
      cpu_fallback(op, stack, false);  // counted as this route's declined call
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
  if (register_safe_softmax(*lib, library)) routed.emplace_back("aten::_safe_softmax");
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
  if (const int64_t n = safe_softmax_calls())
    out.push_back({"aten::_safe_softmax", "diopiSoftmax, diopiMax, diopiLtScalar, diopiWhere", n, 0});
  return out;
}

}  // namespace diopi_bindings
