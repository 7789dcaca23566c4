#include "op_observer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/node.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <unordered_set>

#include "fused_stats.h"

namespace ditorch_precision {

// What the observer needs of one op overload, read once from its schema.
struct OpFacts {
  std::string name;      // "aten::mm"
  std::string overload;  // "default" for the unnamed overload
  bool composite = false;  // decomposed above the Python key: a dispatch mode never sees it
  bool random = false;     // tagged nondeterministic_seeded
  bool allocator = false;  // empty*: its output is uninitialised memory
  bool counted_only = false;  // profiler::*: numbered, never recorded (as the Python hook does)
  bool same_elements = false;  // a view whose output holds exactly its first argument's elements
  // Recorded under another name: aten::_reshape_alias, which reshape calls only where no Python
  // dispatch mode is active (under one it calls view): written as view, without its stride.
  std::string shown_name, shown_overload;
  int hidden_arg = -1;
  int dropout_p = -1;      // position of a dropout_p argument (a random op without randomness at 0)
  std::vector<std::string> arg_names;
  std::vector<c10::TypePtr> arg_types;
  std::vector<bool> arg_ignored;  // where or how a result is stored, not what it is
};

namespace {

// The callback's own calls (the float64 fallback of a device tensor) are not the program's ops,
// and a kernel's inner calls are not either: only the outermost op of this thread is recorded.
thread_local int tl_depth = 0;
thread_local bool tl_in_hook = false;

// Sets tl_in_hook for a scope, also when the scope is left by an exception.
struct InHook {
  InHook() { tl_in_hook = true; }
  ~InHook() { tl_in_hook = false; }
  InHook(const InHook&) = delete;
  InHook& operator=(const InHook&) = delete;
};

struct Pending : at::ObserverContext {
  explicit Pending(bool rec) : recorded(rec) {}
  bool recorded;
  int uncaught = 0;
  int64_t index = 0;
  bool allocator = false;
  at::Tensor source;  // a same-elements view's input
  std::string line;
};

const char* const kAllocators[] = {"aten::empty", "aten::empty_like", "aten::empty_strided",
                                   "aten::new_empty", "aten::new_empty_strided", "aten::empty_permuted"};
// Ops whose autograd kernel does all their work and never reaches the Python key: a dispatch mode
// never shows them.
const char* const kAutogradOnly[] = {"aten::detach_", "aten::set_data", "aten::data", "aten::_version",
                                     "aten::is_leaf", "aten::output_nr", "aten::retain_grad",
                                     "aten::retains_grad", "aten::requires_grad_", "aten::_backward"};
// As summaries.SAME_ELEMENTS: views whose output holds exactly the elements of their first argument.
const char* const kSameElements[] = {"aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::t",
                                     "aten::transpose", "aten::permute", "aten::detach", "aten::alias",
                                     "aten::squeeze", "aten::unsqueeze"};
const char* const kIgnored[] = {"device", "pin_memory", "non_blocking", "memory_format"};

void put_string(std::string& out, std::string_view s) {
  out += '"';
  bool plain = true;
  for (unsigned char c : s) plain = plain && c != '"' && c != '\\' && c >= 0x20;
  if (plain) {
    out.append(s.data(), s.size());
    out += '"';
    return;
  }
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// A double as Python's json writes it: the shortest text that reads back the same value, a float
// (1.0, not 1), and NaN/Infinity for the non-finite values.
void put_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
  if (std::string_view(buf, res.ptr - buf).find_first_of(".e") == std::string_view::npos) out += ".0";
}

void put_int(std::string& out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

// A signature's float: non-finite values as text ("inf"), as signature._value writes them.
void put_arg_double(std::string& out, double v) {
  if (std::isfinite(v))
    put_double(out, v);
  else
    out += std::isnan(v) ? "\"nan\"" : (v > 0 ? "\"inf\"" : "\"-inf\"");
}

c10::TypePtr unwrap_optional(const c10::TypePtr& type) {
  if (type && type->kind() == c10::TypeKind::OptionalType) return type->castRaw<c10::OptionalType>()->getElementType();
  return type;
}

c10::TypePtr element_type(const c10::TypePtr& type) {
  auto t = unwrap_optional(type);
  if (t && t->kind() == c10::TypeKind::ListType) return t->castRaw<c10::ListType>()->getElementType();
  return nullptr;
}

const char* layout_name(int64_t layout) {
  switch (static_cast<c10::Layout>(layout)) {
    case c10::kStrided: return "strided";
    case c10::kSparse: return "sparse_coo";
    case c10::kSparseCsr: return "sparse_csr";
    case c10::kSparseCsc: return "sparse_csc";
    case c10::kSparseBsr: return "sparse_bsr";
    case c10::kSparseBsc: return "sparse_bsc";
    case c10::kMkldnn: return "_mkldnn";
    case c10::kJagged: return "jagged";
    default: return nullptr;
  }
}

const char* memory_format_name(int64_t format) {
  switch (static_cast<c10::MemoryFormat>(format)) {
    case c10::MemoryFormat::Contiguous: return "contiguous_format";
    case c10::MemoryFormat::Preserve: return "preserve_format";
    case c10::MemoryFormat::ChannelsLast: return "channels_last";
    case c10::MemoryFormat::ChannelsLast3d: return "channels_last_3d";
    default: return nullptr;
  }
}

bool floating_or_int(c10::ScalarType d) {
  return c10::isFloatingType(d) || d == at::kLong || d == at::kInt || d == at::kShort || d == at::kChar ||
         d == at::kByte;
}

// A Python number an op was called with travels as a 0-dim "wrapped number" tensor, which the
// Python dispatcher hands to a mode as the number again: not a tensor argument.
bool wrapped_number(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number();
}

template <typename F>
void each_tensor(const c10::IValue& v, const F& f) {
  if (v.isTensor()) {
    if (v.toTensor().defined() && !wrapped_number(v.toTensor())) f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec())
      if (t.defined()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& x : v.toListRef()) each_tensor(x, f);
  } else if (v.isTuple()) {
    for (const c10::IValue& x : v.toTupleRef().elements()) each_tensor(x, f);
  }
}

}  // namespace

OpObserver::OpObserver() = default;

OpObserver::~OpObserver() { stop(); }

void OpObserver::start() {
  if (handle_ != 0) return;
  auto cb = at::RecordFunctionCallback(
                [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                  return current() ? current()->on_start(fn) : nullptr;
                },
                [](const at::RecordFunction& fn, at::ObserverContext* ctx) {
                  if (current() != nullptr) current()->on_end(fn, ctx);
                })
                .needsInputs(true)
                .needsOutputs(true)
                .scopes({at::RecordScope::FUNCTION});
  current() = this;
  handle_ = at::addThreadLocalCallback(std::move(cb));
}

void OpObserver::stop() {
  if (handle_ == 0) return;
  at::removeCallback(handle_);
  handle_ = 0;
  if (current() == this) current() = nullptr;
}

OpObserver*& OpObserver::current() {
  static OpObserver* active = nullptr;
  return active;
}

void OpObserver::tag(const std::vector<at::Tensor>& outputs, const std::string& path, uint64_t seq_start) {
  std::lock_guard<std::mutex> lock(tags_mutex_);
  auto id = path_ids_.try_emplace(path, static_cast<int>(paths_.size()));
  if (id.second) paths_.push_back(path);
  if (node_paths_.size() >= (1u << 22)) node_paths_.clear();  // bounded: forwards long gone
  std::vector<torch::autograd::Node*> todo;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) todo.push_back(t.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second || node->sequence_nr() < seq_start) continue;
    node_paths_.try_emplace(node->sequence_nr(), id.first->second);
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
}

void OpObserver::push_module(std::string path) { modules_.push_back(std::move(path)); }

void OpObserver::pop_module() {
  if (!modules_.empty()) modules_.pop_back();
}

std::pair<std::string, int64_t> OpObserver::drain() {
  std::vector<std::pair<int64_t, std::string>> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held.swap(lines_);
  }
  // In call order: an op an autograd kernel calls (a detach of a saved result) ends before the op
  // that called it. Drained between ops (at module and step boundaries), so no op is split.
  std::stable_sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t size = 0;
  for (const auto& h : held) size += h.second.size() + 1;
  std::string text;
  text.reserve(size);
  for (const auto& h : held) {
    text += h.second;
    text += '\n';
  }
  const auto n = static_cast<int64_t>(held.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& h : held) {  // their buffers serve the next lines
    if (spare_.size() >= 4096) break;
    h.second.clear();
    spare_.push_back(std::move(h.second));
  }
  return {std::move(text), n};
}

void OpObserver::set_dtype_name(c10::ScalarType dtype, std::string name) {
  auto i = static_cast<size_t>(dtype);
  if (dtype_names_.size() <= i) dtype_names_.resize(i + 1);
  dtype_names_[i] = std::move(name);
}

std::string_view OpObserver::dtype_name(c10::ScalarType dtype) const {
  auto i = static_cast<size_t>(dtype);
  if (i < dtype_names_.size() && !dtype_names_[i].empty()) return dtype_names_[i];
  return c10::toString(dtype);
}

const OpFacts* OpObserver::facts(const at::RecordFunction& fn) {
  const char* key = fn.name();
  std::lock_guard<std::mutex> lock(facts_mutex_);
  auto it = facts_.find(key);
  if (it != facts_.end() && it->second->name == key) return it->second.get();
  auto name = fn.operator_name();
  if (!name) return nullptr;  // a named scope, not an op
  auto handle = c10::Dispatcher::singleton().findOp(*name);
  if (!handle) return nullptr;
  auto f = std::make_unique<OpFacts>();
  f->name = name->name;
  f->overload = name->overload_name.empty() ? "default" : name->overload_name;
  f->composite = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  for (const char* a : kAutogradOnly) f->composite = f->composite || f->name == a;
  f->random = handle->hasTag(at::Tag::nondeterministic_seeded);
  for (const char* a : kAllocators) f->allocator = f->allocator || f->name == a;
  f->counted_only = f->name.rfind("profiler::", 0) == 0;
  for (const char* a : kSameElements) f->same_elements = f->same_elements || f->name == a;
  f->shown_name = f->name;
  f->shown_overload = f->overload;
  if (f->name == "aten::_reshape_alias") {
    f->shown_name = "aten::view";
    f->shown_overload = "default";
    f->hidden_arg = 2;  // stride
  }
  const auto& args = handle->schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    f->arg_names.push_back(args[i].name());
    f->arg_types.push_back(args[i].real_type());
    bool ignored = false;
    for (const char* n : kIgnored) ignored = ignored || args[i].name() == n;
    f->arg_ignored.push_back(ignored);
    if (args[i].name() == "dropout_p") f->dropout_p = static_cast<int>(i);
  }
  // Keyed by the schema's own name string, which lives as long as the op is registered; a key
  // reused by another op after it is gone fails the name check above and is replaced.
  auto& slot = facts_[key];
  slot = std::move(f);
  return slot.get();
}

void OpObserver::tensor_meta(std::string& out, const at::Tensor& t, bool with_device) const {
  out += "{\"shape\": [";
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d) out += ", ";
    put_int(out, t.size(d));
  }
  out += "], \"dtype\": ";
  put_string(out, dtype_name(t.scalar_type()));
  if (with_device) {
    out += ", \"device\": ";
    if (t.device().is_cpu())
      out += "\"cpu\"";
    else
      put_string(out, t.device().str());
  }
  out += '}';
}

// One argument as signature._value writes it; `written` false for what it leaves out (None,
// devices, generators, objects).
void OpObserver::value(std::string& out, const c10::IValue& v, const c10::TypePtr& type, bool& written) const {
  written = true;
  const auto real = unwrap_optional(type);
  const auto kind = real ? real->kind() : c10::TypeKind::AnyType;
  if (v.isNone()) {
    written = false;
  } else if (v.isTensor() && wrapped_number(v.toTensor())) {
    const at::Tensor& t = v.toTensor();
    switch (t.scalar_type()) {
      case at::kLong: put_int(out, *t.const_data_ptr<int64_t>()); break;
      case at::kDouble: put_arg_double(out, *t.const_data_ptr<double>()); break;
      case at::kBool: out += *t.const_data_ptr<bool>() ? "true" : "false"; break;
      case at::kComplexDouble: {
        const auto c = *t.const_data_ptr<c10::complex<double>>();
        out += '[';
        put_arg_double(out, c.real());
        out += ", ";
        put_arg_double(out, c.imag());
        out += ']';
        break;
      }
      default: tensor_meta(out, t, false);
    }
  } else if (v.isTensor()) {
    if (v.toTensor().defined())
      tensor_meta(out, v.toTensor(), false);
    else
      written = false;
  } else if (v.isBool()) {
    out += v.toBool() ? "true" : "false";
  } else if (v.isInt() || v.isSymInt()) {
    const int64_t i = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
    const char* name = nullptr;
    if (kind == c10::TypeKind::ScalarTypeType) {
      put_string(out, dtype_name(static_cast<c10::ScalarType>(i)));
      return;
    }
    if (kind == c10::TypeKind::LayoutType) name = layout_name(i);
    if (kind == c10::TypeKind::MemoryFormatType) name = memory_format_name(i);
    if (name != nullptr)
      put_string(out, name);
    else
      put_int(out, i);
  } else if (v.isDouble()) {
    put_arg_double(out, v.toDouble());
  } else if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    out += '[';
    put_arg_double(out, c.real());
    out += ", ";
    put_arg_double(out, c.imag());
    out += ']';
  } else if (v.isString()) {
    put_string(out, v.toStringRef());
  } else if (v.isList() || v.isTuple()) {
    const auto elem = element_type(type);
    out += '[';
    auto items = v.isList() ? std::vector<c10::IValue>(v.toListRef().begin(), v.toListRef().end())
                            : v.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ", ";
      bool w = false;
      const size_t mark = out.size();
      value(out, items[i], elem, w);
      if (!w) {
        out.resize(mark);
        out += "null";
      }
    }
    out += ']';
  } else {
    written = false;  // a device, a generator, a script object: not compared
  }
}

void OpObserver::signature(std::string& out, const OpFacts& op, c10::ArrayRef<const c10::IValue> inputs) const {
  out += "\"signature\": {";
  bool first = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if ((i < op.arg_ignored.size() && op.arg_ignored[i]) || static_cast<int>(i) == op.hidden_arg) continue;
    const size_t mark = out.size();  // the argument is written, then taken back if it has no value
    if (!first) out += ", ";
    put_string(out, i < op.arg_names.size() ? op.arg_names[i] : "arg" + std::to_string(i));
    out += ": ";
    bool written = false;
    value(out, inputs[i], i < op.arg_types.size() ? op.arg_types[i] : nullptr, written);
    if (!written) {
      out.resize(mark);
      continue;
    }
    first = false;
  }
  out += '}';
}

// One output's statistics as summaries.tensor_stats writes them.
void OpObserver::set_step(int64_t step) {
  step_ = step;
  std::lock_guard<std::mutex> lock(known_mutex_);
  known_.clear();
}

const FusedStats* OpObserver::known(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_inference()) return nullptr;  // no version counter
  auto it = known_.find(impl);
  if (it == known_.end() || it->second.ref.expired() || it->second.version != impl->version_counter().current_version())
    return nullptr;
  return &it->second.stats;
}

void OpObserver::remember(const at::Tensor& t, const FusedStats& s) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_inference() || !s.supported) return;
  if (known_.size() >= (1u << 16)) known_.clear();  // a loop that never steps
  known_.insert_or_assign(
      impl, Known{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
                  static_cast<int64_t>(impl->version_counter().current_version()), s});
}

void OpObserver::stats(std::string& out, const at::Tensor& t, bool zeroed, const at::Tensor* source) {
  out += "{\"dtype\": ";
  put_string(out, dtype_name(t.scalar_type()));
  out += ", \"numel\": ";
  put_int(out, t.numel());
  if (t.numel() == 0 || !floating_or_int(t.scalar_type())) {
    out += '}';
    return;
  }
  FusedStats s;
  if (zeroed) {
    s.finite = t.numel();
  } else {
    std::lock_guard<std::mutex> lock(known_mutex_);
    const FusedStats* hit = known(t);
    if (hit == nullptr && source != nullptr) hit = known(*source);
    s = hit != nullptr ? *hit : fused_stats(t);
    remember(t, s);
  }
  if (!s.supported && !zeroed) {  // a device tensor or a dtype the pass does not read: a float64 copy on the CPU
    s = fused_stats(t.detach().to(at::kCPU, at::kDouble));
  }
  out += ", \"nan\": ";
  put_int(out, s.nan);
  out += ", \"inf\": ";
  put_int(out, s.inf);
  if (s.finite > 0) {
    out += ", \"min\": ";
    put_double(out, s.lo);
    out += ", \"max\": ";
    put_double(out, s.hi);
    out += ", \"mean\": ";
    put_double(out, s.sum / static_cast<double>(s.finite));
    out += ", \"norm\": ";
    put_double(out, std::sqrt(s.sumsq));
  }
  out += '}';
}

std::string OpObserver::current_module(bool in_backward) const {
  if (!modules_.empty()) return modules_.back();
  if (!in_backward) return {};
  auto node = torch::autograd::get_current_node();
  if (!node) return {};
  std::lock_guard<std::mutex> lock(tags_mutex_);
  auto it = node_paths_.find(node->sequence_nr());
  return it == node_paths_.end() ? std::string() : paths_[it->second];
}

void OpObserver::line_head(std::string& out, int64_t index, std::string_view op, std::string_view overload,
                           std::string_view phase, const std::string& module, int64_t step) const {
  out += "{\"index\": ";
  put_int(out, index);
  out += ", \"op\": ";
  put_string(out, op);
  out += ", \"overload\": ";
  put_string(out, overload);
  out += ", \"phase\": ";
  put_string(out, phase);
  out += ", \"module\": ";
  if (module.empty())
    out += "null";
  else
    put_string(out, module);
  out += ", \"step\": ";
  put_int(out, step);
  out += ", \"rank\": ";
  put_int(out, rank_);
  out += ", \"callsite\": null, \"api\": null";
}

void OpObserver::module_record(const std::string& op, const std::string& phase, const std::string& module,
                               int64_t step, const std::vector<at::Tensor>& tensors) {
  InHook in_hook;  // a device tensor's float64 copy is no op of the program
  const int64_t index = count_;
  std::string out;
  out.reserve(256);
  line_head(out, index, op, "default", phase, module, step);
  out += ", \"kind\": \"module\", \"inputs\": [], \"outputs\": [";
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i) out += ", ";
    tensor_meta(out, tensors[i], true);
  }
  out += "], \"file\": null, \"stats\": [";
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i) out += ", ";
    stats(out, tensors[i], false);
  }
  out += "]}";
  std::lock_guard<std::mutex> lock(mutex_);
  lines_.emplace_back(index, std::move(out));
}

// Inside a recorded op's kernel: below autograd (ADInplaceOrView excluded).
bool OpObserver::nested() const {
  return tl_depth > 0 && c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView);
}

// Which calls a Python dispatch mode would show, told apart without one:
// - a composite op is decomposed above the Python key: its parts are shown, not it;
// - a call made with the Python key excluded (tensor construction from data) is not shown;
// - a call made inside a recorded op's kernel (below autograd: ADInplaceOrView excluded) is not
//   shown (the mode is off while its handler runs the op), but one its autograd kernel makes (a
//   detach of a saved result) is.
std::unique_ptr<at::ObserverContext> OpObserver::on_start(const at::RecordFunction& fn) {
  if (tl_in_hook || paused_.load(std::memory_order_relaxed) > 0) return nullptr;
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python)) return nullptr;
  const OpFacts* op = facts(fn);
  if (op == nullptr || op->composite) return nullptr;
  if (nested()) {  // no context (an allocation per inner call): on_end finds it nested again
    ++tl_depth;
    return nullptr;
  }
  if (op->counted_only) {
    ++count_;
    return nullptr;
  }
  ++tl_depth;
  InHook in_hook;
  auto p = std::make_unique<Pending>(true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.empty()) {  // a line's buffer from an earlier drain: no allocation
      p->line = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  p->uncaught = std::uncaught_exceptions();
  p->allocator = op->allocator;
  if (op->same_elements && !fn.inputs().empty() && fn.inputs()[0].isTensor()) p->source = fn.inputs()[0].toTensor();
  const int64_t index = count_++;
  p->index = index;
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  const char* phase = in_optimizer_ ? "optimizer" : in_backward ? (modules_.empty() ? "backward" : "recompute")
                                                                 : "forward";
  std::string& out = p->line;
  out.reserve(512);
  line_head(out, index, op->shown_name, op->shown_overload, phase, current_module(in_backward), step_);
  out += ", \"inputs\": [";
  const auto inputs = fn.inputs();
  bool first = true;
  for (const auto& v : inputs) {
    each_tensor(v, [&](const at::Tensor& t) {
      if (!first) out += ", ";
      first = false;
      tensor_meta(out, t, true);
    });
  }
  out += "], \"file\": null, ";
  signature(out, *op, inputs);
  if (op->random) {
    bool drew = true;
    if (op->dropout_p >= 0 && static_cast<size_t>(op->dropout_p) < inputs.size()) {
      const auto& d = inputs[op->dropout_p];
      drew = !((d.isDouble() && d.toDouble() == 0) || (d.isInt() && d.toInt() == 0));
    }
    out += drew ? ", \"random\": true" : ", \"random\": false";
  }
  return p;
}

void OpObserver::on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) {
    // Not recorded. Nested (counted in tl_depth by on_start) iff on_start's tests give the same
    // answers now: the dispatch-key guards and the pause are scoped around the call.
    if (tl_in_hook || paused_.load(std::memory_order_relaxed) > 0 ||
        c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python))
      return;
    const OpFacts* op = facts(fn);
    if (op != nullptr && !op->composite && nested()) --tl_depth;
    return;
  }
  --tl_depth;
  auto* p = static_cast<Pending*>(ctx);
  if (!p->recorded || std::uncaught_exceptions() > p->uncaught) return;  // nested, or the op raised
  InHook in_hook;
  std::string& out = p->line;
  std::vector<at::Tensor> outputs;
  for (const auto& v : fn.outputs()) each_tensor(v, [&](const at::Tensor& t) { outputs.push_back(t); });
  out += ", \"outputs\": [";
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) out += ", ";
    tensor_meta(out, outputs[i], true);
  }
  out += "], ";
  int64_t unwritten = 0;
  if (p->allocator) {  // uninitialised memory: counted as 0, as a Python capture zeroes it
    for (const auto& t : outputs) unwritten += t.numel();
  }
  if (unwritten > 0) {
    out += "\"unwritten\": ";
    put_int(out, unwritten);
    out += ", ";
  }
  out += "\"stats\": [";
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) out += ", ";
    const bool same = p->source.defined() && outputs.size() == 1 && p->source.numel() == outputs[i].numel() &&
                      p->source.scalar_type() == outputs[i].scalar_type();
    stats(out, outputs[i], unwritten > 0, same ? &p->source : nullptr);
  }
  out += "]}";
  std::lock_guard<std::mutex> lock(mutex_);
  lines_.emplace_back(p->index, std::move(out));
}

}  // namespace ditorch_precision
