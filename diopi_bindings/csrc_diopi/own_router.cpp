// The boxed kernel of the own-ABI library's operators (own_router.h). The rules are those the Python router of the
// host-memory device applies (diopi_bindings/device/router.py): outputs from the meta kernel; an in-place form
// computes into a new tensor and copies it into self; an out= tensor of the result's layout, shared with no input,
// is written directly, any other gets the result copied in (an empty one is resized first); a Python number where
// the ABI takes a tensor becomes a 0-dim device tensor of the result's dtype; a CPU tensor operand is moved to the
// call's device; a boolean mask in an index list stands for the columns of its nonzero. A dtype without an ABI code,
// arguments the ABI cannot carry and an error code from the library send the call to the CPU fallback.
#include "own_router.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "cpu_fallback.h"
#include "mask_indices.h"
#include "own_abi.h"
#include "router.h"

namespace diopi_bindings {

namespace {

namespace abi = own_abi;

// Meta-cache keys of the own routes start here, above the DIOPI table's route indices.
constexpr int64_t kMetaKeyBase = int64_t{1} << 32;
constexpr int64_t kMaxDims = 16;

struct Counts {
  std::atomic<int64_t> routed{0};
  std::atomic<int64_t> fallback{0};
  std::atomic<bool> logged{false};
};

std::mutex g_mutex;  // the registrations and the counters' map
std::map<std::string, std::unique_ptr<Counts>> g_counts;
std::map<int64_t, std::unique_ptr<torch::Library>> g_registrations;
int64_t g_next_handle = 1;
int64_t g_next_meta_key = kMetaKeyBase;
std::atomic<int64_t> g_operand_copies{0};
const char* (*g_last_error)() = nullptr;
std::function<void(const std::string&, const std::string&)> g_log;

const char* error_name(int code) {
  switch (code) {
    case abi::DIOPI_ERR_NOT_IMPLEMENTED: return "not implemented";
    case abi::DIOPI_ERR_INVALID_ARGUMENT: return "invalid argument";
    case abi::DIOPI_ERR_DTYPE: return "unsupported dtype";
    case abi::DIOPI_ERR_ALLOCATION: return "allocation failed";
    case abi::DIOPI_ERR_INTERNAL: return "internal error";
    default: return "an unknown error code";
  }
}

std::optional<abi::diopiDtype_t> abi_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::kBool: return abi::DIOPI_DTYPE_BOOL;
    case c10::kInt: return abi::DIOPI_DTYPE_INT32;
    case c10::kLong: return abi::DIOPI_DTYPE_INT64;
    case c10::kHalf: return abi::DIOPI_DTYPE_FLOAT16;
    case c10::kBFloat16: return abi::DIOPI_DTYPE_BFLOAT16;
    case c10::kFloat: return abi::DIOPI_DTYPE_FLOAT32;
    case c10::kDouble: return abi::DIOPI_DTYPE_FLOAT64;
    default: return std::nullopt;
  }
}

std::optional<c10::ScalarType> torch_dtype(int code) {
  for (c10::ScalarType t : {c10::kBool, c10::kInt, c10::kLong, c10::kHalf, c10::kBFloat16, c10::kFloat, c10::kDouble}) {
    if (static_cast<int>(*abi_dtype(t)) == code) return t;
  }
  return std::nullopt;
}

// A call the library cannot take (a dtype without a code, arguments its ABI does not carry, an error code): the
// reason goes to the log line, the call to the CPU.
struct Declined {
  std::string reason;
};

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i] << (sizes.size() == 1 ? "," : "");
  s << ")";
  return s.str();
}

// The memory a call's kernel asks the framework for: scratch blocks (ctx->allocate) on the call's device, which
// live until released, and tensors it requires (ctx->require_tensor: an out* result, or scratch), which live until
// the call returns unless the router takes them as results.
std::mutex g_blocks_mutex;
std::unordered_map<void*, at::Tensor> g_blocks;

struct CallMemory {
  abi::diopiContext context{};
  c10::Device device;
  std::deque<at::Tensor> required;
  std::deque<abi::diopiTensor> handles;
};

abi::diopiTensor handle_of(const at::Tensor& t, abi::diopiDtype_t code) {
  return abi::diopiTensor{t.data_ptr(), t.dim(), t.sizes().data(), t.strides().data(), code,
                          t.is_cpu() ? abi::DIOPI_DEVICE_HOST : abi::DIOPI_DEVICE_DEVICE};
}

void* allocate_block(void* state, int64_t nbytes) noexcept {
  try {
    auto* memory = static_cast<CallMemory*>(state);
    at::Tensor block = at::empty({std::max<int64_t>(nbytes, 1)}, at::TensorOptions().dtype(c10::kByte).device(memory->device));
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    void* ptr = block.data_ptr();
    g_blocks.emplace(ptr, std::move(block));
    return ptr;
  } catch (...) {
    return nullptr;
  }
}

void release_block(void*, void* ptr) noexcept {
  at::Tensor block;  // freed outside the lock
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  auto it = g_blocks.find(ptr);
  if (it == g_blocks.end()) return;
  block = std::move(it->second);
  g_blocks.erase(it);
}

abi::diopiError_t require_tensor(void* state, abi::diopiTensorHandle_t* out, int64_t ndim, const int64_t* shape,
                                 abi::diopiDtype_t dtype) noexcept {
  const std::optional<c10::ScalarType> type = torch_dtype(dtype);
  if (!type) return abi::DIOPI_ERR_DTYPE;
  if (out == nullptr || ndim < 0 || ndim > kMaxDims || (ndim > 0 && shape == nullptr)) return abi::DIOPI_ERR_INVALID_ARGUMENT;
  for (int64_t i = 0; i < ndim; ++i) {
    if (shape[i] < 0) return abi::DIOPI_ERR_INVALID_ARGUMENT;
  }
  auto* memory = static_cast<CallMemory*>(state);
  try {
    at::Tensor& t = memory->required.emplace_back(
        at::empty(c10::IntArrayRef(shape, static_cast<size_t>(ndim)), at::TensorOptions().dtype(*type).device(memory->device)));
    *out = &memory->handles.emplace_back(handle_of(t, dtype));
  } catch (...) {
    return abi::DIOPI_ERR_ALLOCATION;
  }
  return abi::DIOPI_SUCCESS;
}

// The tensor behind a handle the library stored through an out* argument; undefined when it stored none of ours.
at::Tensor taken(const CallMemory& memory, abi::diopiTensorHandle_t h) {
  for (size_t i = 0; i < memory.handles.size(); ++i) {
    if (&memory.handles[i] == h) return memory.required[i];
  }
  return at::Tensor();
}

// An output the router allocates (or, inout, the ATen argument itself) before the call.
bool is_preallocated_output(OwnKind kind) {
  return kind == OwnKind::kOut || kind == OwnKind::kOutOptional || kind == OwnKind::kInout;
}

bool is_device_tensor(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone();
}

void append_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) out.push_back(v.toTensor());
  } else if (v.isTensorList() || v.isList()) {
    for (const c10::IValue& item : v.toListRef()) {
      if (item.isTensor() && item.toTensor().defined()) out.push_back(item.toTensor());
    }
  }
}

class OwnKernel final : public c10::OperatorKernel {
 public:
  OwnKernel(OwnRoute route, Counts* counts, int64_t meta_key)
      : route_(std::move(route)), counts_(counts), meta_key_(meta_key) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const size_t first = stack->size() - n;
    Call call;
    try {
      std::vector<c10::IValue> results = route_.masked_select ? masked_select(*stack, first) : run(call, op, *stack, first);
      counts_->routed.fetch_add(1, std::memory_order_relaxed);
      torch::jit::drop(*stack, n);
      for (c10::IValue& r : results) stack->push_back(std::move(r));
    } catch (const Declined& declined) {
      counts_->fallback.fetch_add(1, std::memory_order_relaxed);
      if (!counts_->logged.exchange(true) && g_log) g_log(route_.counted_as, declined.reason);
      if (call.original_indices) arg(*stack, first, route_.mask_indices) = std::move(*call.original_indices);
      cpu_fallback(op, stack, false);  // counted here, as this overload's fallback
    }
  }

 private:
  // One call: its device, its ABI arguments and what keeps them valid until the library returns.
  struct Call {
    c10::Device device{c10::DeviceType::PrivateUse1, 0};
    std::optional<c10::IValue> original_indices;  // an index list before its masks became nonzero columns
    std::vector<abi::OwnArg> args;
    std::deque<at::Tensor> tensors;
    std::deque<abi::diopiTensor> handles;
    std::deque<std::vector<const void*>> lists;
    std::deque<std::vector<int64_t>> ints;
  };

  c10::IValue& arg(torch::jit::Stack& stack, size_t first, int i) const { return stack[first + static_cast<size_t>(i)]; }

  // The device the call runs on: that of its device tensors (two devices are an error, as on any torch device).
  c10::Device call_device(const torch::jit::Stack& stack, size_t first) const {
    std::vector<at::Tensor> tensors;
    for (size_t i = first; i < stack.size(); ++i) append_tensors(stack[i], tensors);
    std::optional<c10::Device> found;
    for (const at::Tensor& t : tensors) {
      if (!t.device().is_privateuseone()) continue;
      if (found && *found != t.device()) {
        const std::string a = found->str(), b = t.device().str();
        TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                    std::min(a, b), " and ", std::max(a, b), "!");
      }
      found = t.device();
    }
    if (found) return *found;
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    return guard->getDevice();
  }

  // A tensor as the library reads it: on the call's device (a CPU tensor is moved, and counted).
  const at::Tensor& operand(Call& call, const at::Tensor& t) const {
    if (t.device() == call.device) return call.tensors.emplace_back(t);
    g_operand_copies.fetch_add(1, std::memory_order_relaxed);
    return call.tensors.emplace_back(t.to(call.device));
  }

  void* handle(Call& call, const at::Tensor& t) const {
    const std::optional<abi::diopiDtype_t> code = abi_dtype(t.scalar_type());
    if (!code) {
      throw Declined{std::string("dtype ") + c10::toString(t.scalar_type()) +
                     " has no DIOPI code; expected one of Bool, Int, Long, Half, BFloat16, Float, Double"};
    }
    if (t.dim() > kMaxDims) throw Declined{"a tensor with more than 16 dims has no DIOPI handle"};
    return &call.handles.emplace_back(handle_of(t, *code));
  }

  double number(torch::jit::Stack& stack, size_t first, const OwnRouteArg& a) const {
    const c10::IValue* v = a.aten >= 0 ? &arg(stack, first, a.aten) : nullptr;
    if (v != nullptr && !v->isNone()) return v->isDouble() ? v->toDouble() : v->toScalar().toDouble();
    switch (a.fallback) {
      case OwnDefault::kZero: return 0.0;
      case OwnDefault::kMinusInf: return -std::numeric_limits<double>::infinity();
      case OwnDefault::kPlusInf: return std::numeric_limits<double>::infinity();
      case OwnDefault::kDtypeEps:
        switch (arg(stack, first, a.source).toTensor().scalar_type()) {  // torch.finfo(dtype).eps
          case c10::kDouble: return std::numeric_limits<double>::epsilon();
          case c10::kHalf: return 0.0009765625;  // 2^-10
          case c10::kBFloat16: return 0.0078125;  // 2^-7
          default: return static_cast<double>(std::numeric_limits<float>::epsilon());
        }
      case OwnDefault::kRsqrtLast:
        return 1.0 / std::sqrt(static_cast<double>(arg(stack, first, a.source).toTensor().sizes().back()));
      case OwnDefault::kNone: break;
    }
    TORCH_CHECK(false, "diopi: ", route_.overload, ": a number argument is None");
  }

  int64_t integer(torch::jit::Stack& stack, size_t first, const OwnRouteArg& a) const {
    TORCH_CHECK(a.aten >= 0 && !arg(stack, first, a.aten).isNone(), "diopi: ", route_.overload, ": an int argument is None");
    const c10::IValue& v = arg(stack, first, a.aten);
    if (v.isString()) {  // gelu's approximate: 0 none, 1 tanh
      const std::string& s = v.toStringRef();
      TORCH_CHECK(s == "none" || s == "tanh", "diopi: approximate must be 'none' or 'tanh', got '", s, "'");
      return s == "tanh" ? 1 : 0;
    }
    if (v.isInt()) return v.toInt();
    if (v.isBool()) return v.toBool() ? 1 : 0;
    return v.toScalar().toLong();
  }

  // An ABI input from its ATen argument.
  void input(Call& call, torch::jit::Stack& stack, size_t first, const OwnRouteArg& a, abi::OwnArg& out,
             const std::vector<ResultMeta>& metas) const {
    const c10::IValue none;
    const c10::IValue& v = a.aten >= 0 ? arg(stack, first, a.aten) : none;
    if (a.kind == OwnKind::kIn || a.kind == OwnKind::kInOptional) {
      const bool wrapped = v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number();
      if (v.isTensor() && v.toTensor().defined() && !wrapped) {
        out.pointer = handle(call, operand(call, v.toTensor()));
      } else if (wrapped || (!v.isNone() && !v.isTensor())) {
        // A Python number (a Scalar argument, or a wrapped 0-dim tensor) where the ABI takes a tensor: a device
        // tensor of the result's dtype.
        TORCH_CHECK(!metas.empty() && metas[0].defined, "diopi: ", route_.overload, ": no result dtype for a number");
        const c10::Scalar value = wrapped ? v.toTensor().item() : v.toScalar();
        const at::Tensor scalar = at::scalar_tensor(value, at::TensorOptions().dtype(metas[0].dtype));
        out.pointer = handle(call, call.tensors.emplace_back(scalar.to(call.device)));
      } else {
        TORCH_CHECK(a.kind == OwnKind::kInOptional, "diopi: ", route_.overload, ": a required tensor is None");
      }
    } else if (a.kind == OwnKind::kInList || a.kind == OwnKind::kInOptionalList) {
      std::vector<const void*>& list = call.lists.emplace_back();
      for (const c10::IValue& item : v.toListRef()) {
        if (item.isTensor() && item.toTensor().defined()) {
          list.push_back(handle(call, operand(call, item.toTensor())));
        } else {
          TORCH_CHECK(a.kind == OwnKind::kInOptionalList, "diopi: ", route_.overload, ": a list entry is None");
          list.push_back(nullptr);
        }
      }
      out.items = list.data();
      out.length = static_cast<int64_t>(list.size());
    } else if (a.kind == OwnKind::kDouble) {
      out.real = number(stack, first, a);
    } else if (a.kind == OwnKind::kInt) {
      out.integer = integer(stack, first, a);
    } else if (a.kind == OwnKind::kBool) {
      out.flag = !v.isNone() && (v.isBool() ? v.toBool() : v.toScalar().toBool());
    } else if (a.kind == OwnKind::kInts) {
      std::vector<int64_t>& list = call.ints.emplace_back();
      if (v.isInt()) list.push_back(v.toInt());
      else if (!v.isNone()) list = v.toIntVector();
      out.items = list.data();
      out.length = static_cast<int64_t>(list.size());
    } else {
      TORCH_CHECK(false, "diopi: ", route_.overload, ": an output where an input was expected");
    }
  }

  // Whether the library may write out= directly: the result's layout, and no other argument shares its memory.
  bool writable(const Call& call, torch::jit::Stack& stack, size_t first, int target, const ResultMeta& meta) const {
    const at::Tensor& out = arg(stack, first, target).toTensor();
    if (out.device() != call.device || out.sizes() != c10::IntArrayRef(meta.sizes) ||
        out.strides() != c10::IntArrayRef(meta.strides) || out.scalar_type() != meta.dtype) {
      return false;
    }
    const void* memory = out.storage().data();
    for (size_t i = first; i < stack.size(); ++i) {
      if (i == first + static_cast<size_t>(target)) continue;
      std::vector<at::Tensor> others;
      append_tensors(stack[i], others);
      for (const at::Tensor& t : others) {
        if (t.has_storage() && t.storage().data() == memory) return false;
      }
    }
    return true;
  }

  int call_library(Call& call, CallMemory& memory) const {
    memory.context.stream = nullptr;  // this ABI's operators complete before they return
    memory.context.allocator_state = &memory;
    memory.context.allocate = &allocate_block;
    memory.context.release = &release_block;
    memory.context.require_tensor = &require_tensor;
    // Work queued on the device's current stream (DeepLink DIOPI operators) finishes first.
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(call.device.type());
    guard->synchronizeStream(guard->getStream(call.device));
    c10::DeviceGuard on(call.device);  // the library runs on the tensors' device
    return abi::kOwnCalls[route_.call].call(reinterpret_cast<void*>(route_.function), &memory.context, call.args.data());
  }

  void check(int code) const {
    if (code == abi::DIOPI_SUCCESS) return;
    const char* message = g_last_error != nullptr ? g_last_error() : nullptr;
    throw Declined{std::string(abi::kOwnCalls[route_.call].aten) + " failed (" + error_name(code) +
                   "): " + (message != nullptr && message[0] != '\0' ? message : "no message")};
  }

  // Boolean (or uint8) masks of the index list become the columns of their nonzero (mask_indices.h: the library's
  // nonzero for a device mask). A library without nonzero, or a mask that does not fit the tensor it indexes,
  // sends the call to the CPU (torch's error then).
  void replace_masks(Call& call, const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t first) const {
    c10::IValue& list = arg(stack, first, route_.mask_indices);
    bool masked = false;
    for (const c10::IValue& item : list.toListRef()) {
      masked = masked || (item.isTensor() && item.toTensor().defined() &&
                          (item.toTensor().scalar_type() == c10::kBool || item.toTensor().scalar_type() == c10::kByte));
    }
    if (!masked) return;
    const Declined mask{"a boolean mask index (its result's size depends on the data)"};
    if (!route_.nonzero) throw mask;
    call.original_indices = list;
    try {
      expand_index_masks(schema, stack, first);
    } catch (const c10::Error&) {
      throw mask;
    }
  }

  std::vector<c10::IValue> run(Call& call, const c10::OperatorHandle& op, torch::jit::Stack& stack, size_t first) {
    const c10::FunctionSchema& schema = op.schema();
    if (route_.dropout >= 0 && arg(stack, first, route_.dropout).toDouble() != 0.0) {
      throw Declined{"dropout or an attention mask"};
    }
    if (route_.attn_mask >= 0 && arg(stack, first, route_.attn_mask).isTensor() &&
        arg(stack, first, route_.attn_mask).toTensor().defined()) {
      throw Declined{"dropout or an attention mask"};
    }
    if (route_.mask_indices >= 0) replace_masks(call, schema, stack, first);
    call.device = call_device(stack, first);
    bool allocates = false;
    for (const OwnRouteArg& a : route_.args) allocates = allocates || a.kind == OwnKind::kOutAllocated;
    if (allocates) return run_allocating(call, stack, first);

    const std::vector<ResultMeta> metas = result_meta(op, meta_key_, stack, first);
    for (size_t r = 0; r < route_.targets.size(); ++r) {
      at::Tensor target = arg(stack, first, route_.targets[r]).toTensor();
      const ResultMeta& meta = metas.at(r);
      if (route_.form == OwnForm::kOut && target.numel() == 0 && target.sizes() != c10::IntArrayRef(meta.sizes)) {
        target.resize_(meta.sizes);  // as torch does for an empty out= (arange's)
      }
      if (target.sizes() != c10::IntArrayRef(meta.sizes)) {
        throw Declined{"the result's shape " + shape_text(meta.sizes) + " is not the shape of " +
                       schema.arguments()[static_cast<size_t>(route_.targets[r])].name() + " " + shape_text(target.sizes())};
      }
    }
    call.args.resize(route_.args.size());
    std::vector<at::Tensor> made;       // per ABI output: the tensor the library writes
    std::vector<c10::IValue> results;   // per ABI output: what the functional form returns
    std::vector<bool> direct;
    for (size_t i = 0; i < route_.args.size(); ++i) {
      const OwnRouteArg& a = route_.args[i];
      if (!is_preallocated_output(a.kind)) continue;
      const size_t r = made.size();
      if (a.kind == OwnKind::kInout) {
        const at::Tensor& t = arg(stack, first, a.aten).toTensor();
        call.args[i].pointer = handle(call, operand(call, t));
        made.push_back(call.tensors.back());
        results.emplace_back(t);
        direct.push_back(true);
        continue;
      }
      const ResultMeta& meta = metas.at(r);
      if (!meta.defined) {
        made.emplace_back();
        results.emplace_back(at::Tensor());
        direct.push_back(true);
        continue;
      }
      if (route_.form == OwnForm::kOut && writable(call, stack, first, route_.targets.at(r), meta)) {
        const at::Tensor& t = arg(stack, first, route_.targets[r]).toTensor();
        call.args[i].pointer = handle(call, t);
        made.push_back(t);
        results.emplace_back(t);
        direct.push_back(true);
        continue;
      }
      at::Tensor t = at::empty_strided(meta.sizes, meta.strides, at::TensorOptions().dtype(meta.dtype).device(call.device));
      call.args[i].pointer = handle(call, t);
      made.push_back(t);
      results.emplace_back(t);
      direct.push_back(route_.targets.empty());
    }
    for (size_t i = 0; i < route_.args.size(); ++i) {
      const OwnRouteArg& a = route_.args[i];
      if (!is_preallocated_output(a.kind)) input(call, stack, first, a, call.args[i], metas);
    }
    CallMemory memory{{}, call.device, {}, {}};
    check(call_library(call, memory));
    if (route_.targets.empty()) return results;
    std::vector<c10::IValue> written;  // the functional results go into self (in place) or the out= tensors
    for (size_t r = 0; r < route_.targets.size(); ++r) {
      at::Tensor target = arg(stack, first, route_.targets[r]).toTensor();
      if (!direct[r]) target.copy_(made[r]);
      written.emplace_back(target);
    }
    return written;
  }

  // An operator whose outputs the kernel allocates (out*, nonzero): no meta kernel can size them; the library
  // allocates them on the call's device through the context.
  std::vector<c10::IValue> run_allocating(Call& call, torch::jit::Stack& stack, size_t first) {
    if (route_.form == OwnForm::kInplace) {
      throw Declined{"the library allocates this operator's result; an in-place form cannot take it"};
    }
    for (int target : route_.targets) {
      if (!is_device_tensor(arg(stack, first, target))) throw Declined{"an out= argument off the device"};
    }
    call.args.resize(route_.args.size());
    std::vector<abi::diopiTensorHandle_t> slots(route_.args.size(), nullptr);
    for (size_t i = 0; i < route_.args.size(); ++i) {
      const OwnRouteArg& a = route_.args[i];
      if (a.kind == OwnKind::kOutAllocated) call.args[i].pointer = &slots[i];
      else if (is_preallocated_output(a.kind)) throw Declined{"mixed allocated and preallocated outputs"};
      else input(call, stack, first, a, call.args[i], {});
    }
    CallMemory memory{{}, call.device, {}, {}};
    check(call_library(call, memory));
    std::vector<at::Tensor> made;
    for (size_t i = 0; i < route_.args.size(); ++i) {
      if (route_.args[i].kind != OwnKind::kOutAllocated) continue;
      at::Tensor t = taken(memory, slots[i]);
      if (!t.defined()) {
        throw Declined{std::string(abi::kOwnCalls[route_.call].aten) +
                       " returned success without allocating its result through ctx->require_tensor"};
      }
      made.push_back(t);
    }
    std::vector<c10::IValue> results;
    for (size_t r = 0; r < route_.targets.size(); ++r) {
      if (arg(stack, first, route_.targets[r]).toTensor().scalar_type() != made.at(r).scalar_type()) {
        throw Declined{"an out= argument of another dtype than the result's"};
      }
    }
    for (size_t r = 0; r < route_.targets.size(); ++r) {  // out=: resized to the library's result, as torch does
      at::Tensor target = arg(stack, first, route_.targets[r]).toTensor();
      if (target.sizes() != made[r].sizes()) target.resize_(made[r].sizes());
      target.copy_(made[r]);
      results.emplace_back(target);
    }
    if (route_.targets.empty()) {
      for (at::Tensor& t : made) results.emplace_back(std::move(t));
    }
    return results;
  }

  // masked_select: the input indexed by the mask, both broadcast to one shape (torch's own rule), so the library's
  // nonzero and index serve it. The CPU (with torch's errors) takes a mask that is not boolean or does not
  // broadcast, an operand off the device, an out= of another dtype.
  std::vector<c10::IValue> masked_select(torch::jit::Stack& stack, size_t first) {
    const c10::IValue& self = stack[first];
    const c10::IValue& mask = stack[first + 1];
    const bool has_out = stack.size() - first > 2;
    const Declined lacks{""};
    if (!is_device_tensor(self) || !is_device_tensor(mask) || mask.toTensor().scalar_type() != c10::kBool) throw lacks;
    if (has_out && (!is_device_tensor(stack[first + 2]) ||
                    stack[first + 2].toTensor().scalar_type() != self.toTensor().scalar_type())) {
      throw lacks;
    }
    std::vector<int64_t> shape;
    try {
      shape = at::infer_size(self.toTensor().sizes(), mask.toTensor().sizes());
    } catch (const c10::Error&) {
      throw lacks;
    }
    if (shape.empty()) throw lacks;  // a 0-dim mask is no index list's mask
    c10::List<std::optional<at::Tensor>> indices;
    indices.push_back(mask.toTensor().expand(shape));
    at::Tensor selected = at::index(self.toTensor().expand(shape), indices);
    if (!has_out) return {selected};
    at::Tensor out = stack[first + 2].toTensor();
    out.resize_(selected.sizes());
    out.copy_(selected);
    return {out};
  }

  OwnRoute route_;
  Counts* counts_;
  int64_t meta_key_;
};

}  // namespace

int64_t register_own_routes(const std::vector<OwnRoute>& routes, uintptr_t last_error,
                            std::function<void(const std::string&, const std::string&)> log) {
  std::lock_guard<std::mutex> lock(g_mutex);
  // Set once, before any kernel reads them: a later registration (after deeplink.attach) serves the same library.
  if (g_last_error == nullptr) g_last_error = reinterpret_cast<const char* (*)()>(last_error);
  if (!g_log) g_log = std::move(log);
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                              __LINE__);
  for (const OwnRoute& route : routes) {
    TORCH_CHECK(route.masked_select || route.call < abi::kOwnCallCount, "diopi: ", route.overload,
                ": no schema operator ", route.call);
    std::unique_ptr<Counts>& counts = g_counts[route.counted_as];
    if (!counts) counts = std::make_unique<Counts>();
    const std::string name = route.overload.substr(6);  // without "aten::"
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                std::make_unique<OwnKernel>(route, counts.get(), g_next_meta_key++)));
  }
  const int64_t handle = g_next_handle++;
  g_registrations.emplace(handle, std::move(lib));
  return handle;
}

void drop_own_routes(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_registrations.erase(handle);
}

namespace {

std::vector<std::pair<std::string, int64_t>> counted(std::atomic<int64_t> Counts::*field) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [name, counts] : g_counts) {
    if (const int64_t n = ((*counts).*field).load(std::memory_order_relaxed)) out.emplace_back(name, n);
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> own_routed_counts() { return counted(&Counts::routed); }

std::vector<std::pair<std::string, int64_t>> own_fallback_counts() { return counted(&Counts::fallback); }

int64_t own_operand_copies() { return g_operand_copies.load(std::memory_order_relaxed); }

}  // namespace diopi_bindings
