// The diopi device's boxed fallback (cpu_fallback.h), modelled on at::native::cpu_fallback, with what that one
// lacks: device generators, results aliasing their inputs, tensor lists written back, and counts per overload and
// per copy reason that the Python reports read.
#include "cpu_fallback.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <functional>
#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace diopi_bindings {

namespace {

std::mutex g_mutex;  // guards g_counts and g_first
std::unordered_map<std::string, int64_t> g_counts;
std::function<void(const std::string&)> g_first;

enum Reason { kToHost = 0, kToDevice = 1 };
constexpr std::array<const char*, 2> kReasons{"fallback to host", "fallback to device"};
std::array<std::atomic<int64_t>, 2> g_copies{};

bool on_device(const at::Tensor& t) { return t.defined() && t.device().is_privateuseone(); }

std::string overload_name(const c10::FunctionSchema& schema) {
  return schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
}

void count_call(const c10::FunctionSchema& schema) {
  std::string name = overload_name(schema);
  std::function<void(const std::string&)> first;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_counts[name]++ == 0) first = g_first;
  }
  if (first) first(name);  // outside the lock: the callback may take the GIL
}

c10::Device current_device() {
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  return guard->getDevice();
}

// A view (a result aliasing an input without writing it): only metadata changes. The meta kernel gives the view's
// sizes, strides and offset; the result is the first input's storage seen that way.
bool is_view(const c10::FunctionSchema& schema) {
  const auto& returns = schema.returns();
  if (schema.name() == "aten::_unsafe_view") return true;  // reshape's helper: a view its schema does not mark
  if (returns.empty()) return false;
  for (const auto& r : returns) {
    if (r.alias_info() == nullptr || r.alias_info()->isWrite()) return false;
  }
  return true;
}

at::Tensor alias_of(const at::Tensor& base, const at::Tensor& meta) {
  if (meta.scalar_type() == base.scalar_type()) {
    return at::as_strided(base, meta.sizes(), meta.strides(), base.storage_offset() + meta.storage_offset());
  }
  // The same bytes in another dtype (view_as_real, view(dtype)): the meta view's offset counts its own elements
  // from the base's first byte.
  const int64_t offset =
      base.storage_offset() * static_cast<int64_t>(base.element_size()) / static_cast<int64_t>(meta.element_size()) +
      meta.storage_offset();
  at::Tensor view = at::empty({0}, base.options().dtype(meta.scalar_type()));
  return view.set_(base.storage(), offset, meta.sizes(), meta.strides());
}

void view_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first) {
  const size_t n = op.schema().arguments().size();
  at::Tensor base;
  torch::jit::Stack meta;
  meta.reserve(n);
  for (size_t i = first; i < first + n; ++i) {
    if (!base.defined() && (*stack)[i].isTensor()) base = (*stack)[i].toTensor();
    meta.push_back(to_meta((*stack)[i]));
  }
  TORCH_CHECK(base.defined(), "diopi: the view ", overload_name(op.schema()), " has no tensor argument");
  op.callBoxed(meta);
  torch::jit::drop(*stack, n);
  for (c10::IValue& r : meta) {
    if (r.isTensor()) {
      stack->emplace_back(alias_of(base, r.toTensor()));
    } else if (r.isTensorList()) {
      std::vector<at::Tensor> views;
      for (const at::Tensor& m : r.toTensorVector()) views.push_back(alias_of(base, m));
      stack->emplace_back(views);
    } else {
      stack->push_back(std::move(r));
    }
  }
}

// One call's trip to the host: the device tensors it copied, the device generators it lent to CPU generators, and
// the device its results go to. Device memory travels per storage span, not per tensor: the call's tensors of one
// device storage whose bytes overlap (views of one another, an out= that is also an input) become views of one
// host buffer, so the CPU kernel sees their aliasing as the CPU would (its overlap checks included); a span that is
// only written (an out= that no input shares bytes with) is not copied to the host.
class HostTrip {
 public:
  // Plans the host buffers of the call's device tensors (the operator's arguments, before to_host).
  void plan(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args) {
    for (size_t i = 0; i < args.size(); ++i) {
      const bool read = !schema.arguments()[i].is_out();  // an out= is written, never read
      const c10::IValue& v = args[i];
      if (v.isTensor()) {
        add(v.toTensor(), read);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) add(t, read);
      } else if (v.isList()) {
        for (const c10::IValue& item : v.toListRef()) {
          if (item.isTensor()) add(item.toTensor(), read);
        }
      }
    }
    make_host_buffers();
  }

  // The host value of an argument (a tensor, a list of tensors or of optional tensors, a device, a generator).
  c10::IValue to_host(const c10::IValue& v) {
    if (v.isTensor()) return c10::IValue(host(v.toTensor()));
    if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(host(t));
      return c10::IValue(list);
    }
    if (v.isList()) {  // Tensor?[] (index's indices) and other generic lists
      const c10::List<c10::IValue> list = v.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& item : list) out.push_back(item.isTensor() ? c10::IValue(host(item.toTensor())) : item);
      return c10::IValue(out);
    }
    if (v.isDevice() && v.toDevice().is_privateuseone()) {
      if (!device_ && v.toDevice().has_index()) device_ = v.toDevice();
      return c10::IValue(c10::Device(c10::kCPU));
    }
    if (v.isGenerator() && v.toGenerator().device().is_privateuseone()) return c10::IValue(lend(v.toGenerator()));
    return v;
  }

  c10::Device device() const { return device_ ? *device_ : current_device(); }

  // A CPU generator with the CPU part of `device_generator`'s state; it writes the advanced state back in finish().
  // The device generator stays locked until then: the routed DIOPI random functions draw from it too.
  at::Generator lend(at::Generator device_generator) {
    locks_.emplace_back(device_generator.mutex());
    at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>();
    cpu.set_state(cpu_part(device_generator));
    lent_.emplace_back(device_generator, cpu);
    return cpu;
  }

  void finish() {
    for (auto& [device_generator, cpu] : lent_) device_generator.set_state(cpu.get_state());
    lent_.clear();
    locks_.clear();
  }

  // The device tensor whose host view `t` is, or undefined.
  at::Tensor original(const at::Tensor& t) const {
    if (!t.defined()) return {};
    auto it = by_host_.find(t.unsafeGetTensorImpl());
    return it == by_host_.end() ? at::Tensor() : it->second;
  }

  static at::Tensor cpu_part(const at::Generator& generator) {
    static const int64_t cpu_bytes = at::Tensor(at::CPUGeneratorImpl().get_state()).numel();
    return generator.get_state().narrow(0, 0, cpu_bytes).clone();
  }

 private:
  // A device tensor of the call: the bytes [begin, end) of its storage it covers, and whether the call reads them.
  struct Piece {
    at::Tensor device;
    bool read;
    int64_t begin, end;
  };

  void add(const at::Tensor& t, bool read) {
    if (!on_device(t)) return;
    if (!device_) {
      device_ = t.device();
    } else if (*device_ != t.device()) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  *device_, " and ", t.device(), "!");
    }
    auto it = piece_of_.find(t.unsafeGetTensorImpl());
    if (it != piece_of_.end()) {  // the same tensor twice (an out= that is also an input): read if either reads
      pieces_[it->second].read = pieces_[it->second].read || read;
      return;
    }
    const int64_t item = static_cast<int64_t>(t.element_size());
    const int64_t begin = t.storage_offset() * item;  // torch's strides are never negative
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    piece_of_.emplace(t.unsafeGetTensorImpl(), pieces_.size());
    pieces_.push_back({t, read, begin, t.numel() == 0 ? begin : begin + (last + 1) * item});
  }

  // One host buffer per run of overlapping pieces of a storage; each piece becomes a view of its buffer.
  void make_host_buffers() {
    std::vector<size_t> order(pieces_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto storage = [&](size_t i) { return pieces_[i].device.storage().unsafeGetStorageImpl(); };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return storage(a) != storage(b) ? std::less<>()(storage(a), storage(b)) : pieces_[a].begin < pieces_[b].begin;
    });
    for (size_t lo = 0; lo < order.size();) {
      size_t hi = lo + 1;
      int64_t end = pieces_[order[lo]].end;
      bool read = pieces_[order[lo]].read;
      while (hi < order.size() && storage(order[hi]) == storage(order[lo]) && pieces_[order[hi]].begin < end) {
        end = std::max(end, pieces_[order[hi]].end);
        read = read || pieces_[order[hi]].read;
        ++hi;
      }
      constexpr int64_t kAlign = 16;  // the largest element: every piece's offset in the buffer is whole elements
      const int64_t begin = pieces_[order[lo]].begin / kAlign * kAlign;
      at::Tensor buffer = at::empty({end - begin}, at::TensorOptions().dtype(at::kByte));
      if (read && end > begin) {
        const at::Tensor& any = pieces_[order[lo]].device;
        at::Tensor bytes = at::empty({0}, any.options().dtype(at::kByte));
        buffer.copy_(bytes.set_(any.storage(), begin, {end - begin}, {1}));
        g_copies[kToHost].fetch_add(1, std::memory_order_relaxed);  // as the device counts: bytes moved
      }
      for (size_t k = lo; k < hi; ++k) {
        const at::Tensor& t = pieces_[order[k]].device;
        const int64_t item = static_cast<int64_t>(t.element_size());
        at::Tensor view = at::empty({0}, t.options().device(c10::kCPU));
        view.set_(buffer.storage(), (t.storage_offset() * item - begin) / item, t.sizes(), t.strides());
        if (t.is_conj()) view._set_conj(true);
        if (t.is_neg()) view._set_neg(true);
        by_device_.emplace(t.unsafeGetTensorImpl(), view);
        by_host_.emplace(view.unsafeGetTensorImpl(), t);
      }
      lo = hi;
    }
  }

  at::Tensor host(const at::Tensor& t) {
    if (!on_device(t)) return t;
    auto it = by_device_.find(t.unsafeGetTensorImpl());
    TORCH_CHECK(it != by_device_.end(), "diopi: a device tensor of the call was not planned for the host");
    return it->second;
  }

  std::optional<c10::Device> device_;
  std::vector<Piece> pieces_;
  std::unordered_map<const c10::TensorImpl*, size_t> piece_of_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> by_device_, by_host_;
  std::vector<std::pair<at::Generator, at::Generator>> lent_;
  std::vector<std::unique_lock<std::mutex>> locks_;
};

// ATen's CPU native_dropout draws from the CPU's default generator; this is it with the generator explicit (the
// same draws for a seed): a Bernoulli(1 - p) mask in the input's dtype, the input scaled by 1/(1 - p) where kept.
std::pair<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train,
                                                 const at::Generator& generator) {
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (!train.has_value() || *train) {
    const double keep = 1.0 - p;
    at::Tensor mask = at::empty_like(input, at::MemoryFormat::Contiguous).bernoulli_(keep, generator);
    at::Tensor output = input.mul(mask).mul_(keep == 0 ? 0.0 : 1.0 / keep);
    return {output, mask.to(at::kBool)};
  }
  return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
}

// ATen's random operators without a generator argument that this fallback can receive and the CPU can run: each
// runs with the device generator explicit (none borrows the CPU's default generator). A test checks the list
// against ATen's tags and dispatch table.
constexpr std::array<const char*, 2> kDrawExplicitly{"aten::native_dropout", "aten::_scaled_dot_product_flash_attention_for_cpu"};

int argument_index(const c10::FunctionSchema& schema, const char* name) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == name) return static_cast<int>(i);
  }
  return -1;
}

// The written argument a return aliases (an in-place self, an out= tensor), or -1.
int written_argument(const c10::FunctionSchema& schema, const c10::AliasInfo* alias) {
  if (alias == nullptr || !alias->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t j = 0; j < args.size(); ++j) {
    if (args[j].alias_info() != nullptr && args[j].alias_info()->isWrite() &&
        args[j].alias_info()->beforeSets() == alias->beforeSets()) {
      return static_cast<int>(j);
    }
  }
  return -1;
}

void write_back(const at::Tensor& original, const at::Tensor& host) {
  if (!on_device(original)) return;
  if (!original.sizes().equals(host.sizes())) {  // an out= the operator resized, to its inputs' layout as on the CPU
    original.resize_(host.sizes());
    if (host.is_non_overlapping_and_dense() && !original.strides().equals(host.strides())) {
      original.as_strided_(host.sizes(), host.strides());
    }
  }
  if (host.numel() > 0) g_copies[kToDevice].fetch_add(1, std::memory_order_relaxed);
  original.copy_(host);
}

void counted_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The CPU's default generator with a device generator's state, for a random operator that has no generator
// argument. The device generator gets the advanced state when the call returns (commit); the CPU gets its own
// state back in any case, a failed call included.
class BorrowedCpuGenerator {
 public:
  explicit BorrowedCpuGenerator(const c10::Device& device)
      : device_generator_(at::globalContext().defaultGenerator(device)),
        device_lock_(device_generator_.mutex()),
        cpu_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    saved_ = cpu_.get_state();
    cpu_.set_state(HostTrip::cpu_part(device_generator_));
  }
  BorrowedCpuGenerator(const BorrowedCpuGenerator&) = delete;
  BorrowedCpuGenerator& operator=(const BorrowedCpuGenerator&) = delete;

  void commit() {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    device_generator_.set_state(cpu_.get_state());
  }

  ~BorrowedCpuGenerator() {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_state(saved_);  // a state the CPU generator gave: it cannot be refused
  }

 private:
  at::Generator device_generator_;
  std::lock_guard<std::mutex> device_lock_;
  at::Generator cpu_;
  at::Tensor saved_;
};

void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace

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
  if (v.isList()) {  // Tensor?[] (index's indices): its tensors too, None entries kept
    const c10::List<c10::IValue> list = v.toList();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const c10::IValue& item : list) out.push_back(to_meta(item));
    return c10::IValue(out);
  }
  if (v.isDevice()) return c10::IValue(c10::Device(c10::kMeta));
  return v;
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool count) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t first = stack->size() - n;
  if (is_view(schema)) {
    view_fallback(op, stack, first);
    return;
  }
  if (count) count_call(schema);
  try {
    run_on_host(op, stack);
  } catch (c10::Error& e) {  // torch's own error (its type kept), with the operator and the fallback named
    e.add_context("diopi: " + overload_name(schema) + " ran on the CPU (the diopi device's CPU fallback)");
    throw;
  }
}

namespace {

// cpu_fallback's trip to the host: inputs copied, the CPU kernel, written arguments and results back.
void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t first = stack->size() - n;
  const std::vector<c10::IValue> originals(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  HostTrip trip;
  trip.plan(schema, originals);
  for (size_t i = first; i < first + n; ++i) (*stack)[i] = trip.to_host((*stack)[i]);
  const c10::Device device = trip.device();

  // No generator given: the device's default one, not the CPU's.
  const int generator_arg = argument_index(schema, "generator");
  if (generator_arg >= 0 && (*stack)[first + generator_arg].isNone()) {
    (*stack)[first + generator_arg] = trip.lend(at::globalContext().defaultGenerator(device));
  }
  const std::vector<c10::IValue> host_args(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());

  if (generator_arg < 0 && schema.name() == kDrawExplicitly[0] && schema.overload_name().empty()) {
    const at::Generator generator = trip.lend(at::globalContext().defaultGenerator(device));
    auto [output, mask] = native_dropout(host_args[0].toTensor(), host_args[1].toDouble(),
                                         host_args[2].toOptional<bool>(), generator);
    torch::jit::drop(*stack, n);
    stack->emplace_back(std::move(output));
    stack->emplace_back(std::move(mask));
  } else if (generator_arg < 0 && op.hasTag(at::Tag::nondeterministic_seeded) &&
             schema.name() != kDrawExplicitly[1]) {  // flash attention on the CPU refuses dropout: it draws nothing
    // A random operator without a generator argument (another library's) draws from the CPU's default generator:
    // lend it the device generator's state for the call. A thread drawing from the CPU's default generator
    // meanwhile is not protected (torch has no per-thread default).
    BorrowedCpuGenerator borrowed(device);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    borrowed.commit();
  } else {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  trip.finish();  // the device generators advance

  // Written arguments (in-place self, out=, a written list) get the host results.
  const auto& args = schema.arguments();
  for (size_t j = 0; j < n; ++j) {
    if (args[j].alias_info() == nullptr || !args[j].alias_info()->isWrite()) continue;
    if (originals[j].isTensor()) {
      write_back(originals[j].toTensor(), host_args[j].toTensor());
    } else if (originals[j].isTensorList()) {
      const std::vector<at::Tensor> device_list = originals[j].toTensorVector();
      const std::vector<at::Tensor> host_list = host_args[j].toTensorVector();
      for (size_t k = 0; k < device_list.size(); ++k) write_back(device_list[k], host_list[k]);
    }
  }

  // Results: a written argument's is the caller's own device tensor; a host copy's is its device tensor; others move.
  const size_t results = schema.returns().size();
  const size_t begin = stack->size() - results;
  auto to_device = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().is_privateuseone()) return t;
    at::Tensor original = trip.original(t);
    if (original.defined()) return original;
    if (t.numel() > 0) g_copies[kToDevice].fetch_add(1, std::memory_order_relaxed);
    return t.to(device);
  };
  for (size_t r = 0; r < results; ++r) {
    c10::IValue& v = (*stack)[begin + r];
    const int written = written_argument(schema, schema.returns()[r].alias_info());
    if (written >= 0) {
      v = originals[static_cast<size_t>(written)];
    } else if (v.isTensor()) {
      v = to_device(v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(to_device(t));
      v = c10::IValue(list);
    }
  }
}

void counted_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { cpu_fallback(op, stack, true); }

}  // namespace

void register_fallback(std::function<void(const std::string&)> first_fallback) {
  static std::once_flag once;
  std::call_once(once, [&] {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_first = std::move(first_fallback);
    }
    // Leaked on purpose: the fallback serves the device as long as the process lives.
    auto* lib = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&counted_fallback>());
  });
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_counts.begin(), g_counts.end()};
}

std::vector<std::string> draw_explicitly() { return {kDrawExplicitly.begin(), kDrawExplicitly.end()}; }

std::vector<std::pair<std::string, int64_t>> fallback_copies() {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < kReasons.size(); ++i) out.emplace_back(kReasons[i], g_copies[i].load());
  return out;
}

}  // namespace diopi_bindings
