#include "op_observer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/graph_task.h>
#if __has_include(<torch/csrc/autograd/node.h>)
#include <torch/csrc/autograd/node.h>
#else  // torch before 2.13
#include <torch/csrc/autograd/function.h>
#endif
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <unordered_set>

#include "fused_stats.h"
#include "unwritten_memory.h"

namespace ditorch_precision {

namespace {

// The callback's own calls (the float64 fallback of a device tensor) are not the program's ops,
// and a kernel's inner calls are not either: only the outermost op of this thread is recorded.
thread_local int tl_depth = 0;
// Recorded ops running on this thread without an autograd kernel of their own (OpFacts::own_autograd).
thread_local int tl_sealed = 0;
thread_local bool tl_in_hook = false;

// Sets tl_in_hook for a scope, also when the scope is left by an exception.
struct InHook {
  InHook() { tl_in_hook = true; }
  ~InHook() { tl_in_hook = false; }
  InHook(const InHook&) = delete;
  InHook& operator=(const InHook&) = delete;
};

}  // namespace

struct Pending : at::ObserverContext {
  int uncaught = 0;
  // A collective's kernel runs with RecordFunction off on this thread, and so do the threads its
  // work runs on (they inherit this thread's state): what it calls (a functional collective's
  // c10d op, gloo's copies into the output) is its own, as a dispatch mode, off while its handler
  // runs the op, never sees it. Restored when it ends.
  bool muted = false, was_enabled = true;
  bool sealed = false;  // counted in tl_sealed while it runs
  int64_t in_unwritten = 0;  // its inputs' elements no op wrote since an empty*, before it ran
  std::vector<at::Tensor> written;  // the tensors it writes, where some memory is unwritten
  at::Tensor source;  // a same-elements view's input
  at::Tensor reduced;  // a reduction's first argument (stats capture)
  std::vector<std::pair<int64_t, at::Tensor>> in_masks;  // full capture: (k, mask) of its k-th input tensor
  std::vector<c10::IValue> transfer_args;  // a receive's arguments, for its transfer record once issued
  c10::IValue first_arg;  // OpFacts::first_arg_out: its output
  std::unique_ptr<Record> record;
};

namespace {

void fill_meta(Meta& m, const at::Tensor& t) {
  const auto sizes = t.sizes();
  m.shape.assign(sizes.begin(), sizes.end());
  m.dtype = t.scalar_type();
  m.device = t.device();
}

// An op's facts depend on its schema alone: kept for the process, shared by every observer (a
// capture does not describe its ops again), never freed (queued records point at them).
struct FactsTable {
  std::mutex mutex;
  std::unordered_map<const char*, std::unique_ptr<OpFacts>> by_name;  // by the schema's name (one per overload)
  std::vector<std::unique_ptr<OpFacts>> retired;  // replaced, still pointed at by queued records
};
FactsTable& facts_table() {
  static auto* table = new FactsTable();  // leaked: an observer may outlive static destruction
  return *table;
}

// facts() without a lock or a name compare on its hit path (every callback, inner calls too): each
// thread keeps what it found by the schema's name pointer, until the epoch moves: an op
// deregistered (its name's memory may then hold another op's name; the locked lookup tells them
// apart by name).
std::atomic<uint64_t> g_facts_epoch{1};

struct FactsCache {
  static constexpr size_t kSlots = 1024;  // direct-mapped: a collision costs one locked lookup
  uint64_t epoch = 0;
  std::array<std::pair<const char*, const OpFacts*>, kSlots> slots{};
  static size_t slot(const char* key) { return (reinterpret_cast<uintptr_t>(key) >> 3) % kSlots; }
};
thread_local FactsCache tl_facts;

struct CountDeregistrations : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override { g_facts_epoch.fetch_add(1); }
};

// Thread-local scratch for an op's outputs and their unwritten masks: no allocation per op.
thread_local std::vector<at::Tensor> tl_outputs, tl_masks;

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
// Ops with outputs that reduce their first argument, whose statistics a stats capture keeps too
// (OpFacts::reduction; summaries.REDUCTIONS names the same).
const char* const kReductions[] = {"aten::sum",
                                   "aten::mean",
                                   "aten::nansum",
                                   "aten::native_layer_norm",
                                   "aten::native_layer_norm_backward",
                                   "aten::native_group_norm",
                                   "aten::native_batch_norm",
                                   "aten::_native_batch_norm_legit"};
// The backends whose autograd key takes an op's CompositeImplicitAutograd kernel only where the op has
// no kernel for the backend itself (the dispatcher's rule); a call on another backend is judged as if on
// all of them.
const c10::DispatchKey kBackendKeys[] = {c10::DispatchKey::CPU, c10::DispatchKey::CUDA, c10::DispatchKey::XPU,
                                         c10::DispatchKey::MPS, c10::DispatchKey::HPU, c10::DispatchKey::PrivateUse1};
const char* const kIgnored[] = {"device", "pin_memory", "non_blocking", "memory_format"};

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
  } else if (v.isList()) {  // a tensor list too (its items are tensors)
    for (const c10::IValue& x : v.toListRef()) each_tensor(x, f);
  } else if (v.isTuple()) {
    for (const c10::IValue& x : v.toTupleRef().elements()) each_tensor(x, f);
  }
}

// Whether the call is decomposed above the Python key (OpFacts::implicit): on the backend of its first
// tensor argument, judged by that backend's kernel; with no tensor argument, or on a backend not listed,
// by all of them (decomposed only where none has a kernel).
bool composite_on(const OpFacts& op, c10::ArrayRef<c10::IValue> inputs) {
  if (op.autograd_only) return true;
  if (!op.implicit) return false;
  for (const auto& v : inputs) {
    bool found = false;
    c10::DispatchKey backend = c10::DispatchKey::Undefined;
    each_tensor(v, [&](const at::Tensor& t) {
      if (!found) backend = c10::highestPriorityBackendTypeId(t.key_set()), found = true;
    });
    if (!found) continue;
    for (c10::DispatchKey k : kBackendKeys)
      if (k == backend) return !op.backend_kernels.has(k);
    break;
  }
  return op.backend_kernels.empty();
}

// Whether composite_on's answer depends on the call's backend, so needs its inputs: RecordFunction holds
// them only until the kernel runs, so on_start keeps its answer for on_end in tl_composite.
bool backend_dependent(const OpFacts& op) { return !op.autograd_only && op.implicit && !op.backend_kernels.empty(); }

// on_start's composite_on answers for the backend-dependent calls it returned no context for, innermost
// last (a thread's calls end in the reverse order of their starts).
thread_local std::vector<bool> tl_composite;

// Whether an autograd kernel of the op's own runs for this call: it has one, and some input tensor
// carries an autograd key (a factory such as zeros has none: its kernel runs straight away).
bool runs_autograd(const OpFacts& op, c10::ArrayRef<c10::IValue> inputs) {
  if (!op.own_autograd) return false;
  bool any = false;
  for (const auto& v : inputs)
    each_tensor(v, [&](const at::Tensor& t) { any = any || t.key_set().has(c10::DispatchKey::AutogradFunctionality); });
  return any;
}

}  // namespace

OpObserver::OpObserver() {
  // kept for the process: the dispatcher may outlive this module's static objects
  static auto* listening =
      new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
          std::make_unique<CountDeregistrations>()));
  static_cast<void>(listening);
}

OpObserver::~OpObserver() {
  stop();
  try {
    close_index();
  } catch (...) {  // a destructor does not raise: Python closes the index itself and sees the error
  }
}

void OpObserver::start() {
  if (handle_ != 0) return;
  // A forked child (a fork-started DataLoader worker, os.fork) runs the parent's program on: its
  // ops are not the capture's, and its copy of the writer is not to be touched (IndexWriter::forked).
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { pthread_atfork(nullptr, nullptr, [] { current() = nullptr; }); });
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
  handle_ = at::addThreadLocalCallback(cb);
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

const std::string* OpObserver::intern(const std::string& path) {
  auto it = path_ids_.find(path);
  if (it != path_ids_.end()) return it->second;
  const std::string* kept = &paths_.emplace_back(path);
  path_ids_.emplace(std::string_view(*kept), kept);
  return kept;
}

void OpObserver::tag(const std::vector<at::Tensor>& outputs, const std::string& path, uint64_t seq_start) {
  std::lock_guard<std::mutex> lock(tags_mutex_);
  const std::string* kept = intern(path);
  if (node_paths_.size() >= (1u << 22)) node_paths_.clear();  // bounded: forwards long gone
  std::vector<torch::autograd::Node*> todo;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) todo.push_back(t.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second || node->sequence_nr() < seq_start) continue;
    node_paths_.try_emplace(node->sequence_nr(), kept);
    for (const auto& edge : node->next_edges()) {
      if (!edge.function || edge.function->sequence_nr() != UINT64_MAX) {
        todo.push_back(edge.function.get());
        continue;
      }
      // a parameter's AccumulateGrad: no number of its own, kept by node while it lives
      if (leaf_paths_.size() >= (1u << 16))
        for (auto it = leaf_paths_.begin(); it != leaf_paths_.end();)
          it = it->second.first.expired() ? leaf_paths_.erase(it) : ++it;
      auto it = leaf_paths_.find(edge.function.get());
      if (it == leaf_paths_.end())
        leaf_paths_.emplace(edge.function.get(), std::make_pair(WeakNode(edge.function), kept));
      else if (it->second.first.expired())
        it->second = {WeakNode(edge.function), kept};
    }
  }
}

void OpObserver::push_module(const std::string& path) {
  std::lock_guard<std::mutex> lock(tags_mutex_);
  modules_.push_back(intern(path));
}

void OpObserver::pop_module() {
  std::lock_guard<std::mutex> lock(tags_mutex_);
  if (!modules_.empty()) modules_.pop_back();
}

void OpObserver::open_index(const std::string& path, size_t max_queued) {
  if (handle_ != 0) throw std::runtime_error("the index is opened before the observer starts");
  if (writer_) close_index();
  writer_ = std::make_unique<IndexWriter>(path, dtype_names_, max_queued);
  if (full_) writer_->set_parts(parts_dir_, part_bytes_, max_queued_bytes_);
}

void OpObserver::set_full(const std::string& parts_dir, int64_t part_bytes, int64_t max_bytes,
                          int64_t max_queued_bytes) {
  if (handle_ != 0) throw std::runtime_error("a full capture is set before the observer starts");
  full_ = true;
  parts_dir_ = parts_dir;
  part_bytes_ = part_bytes;
  max_bytes_ = max_bytes;
  max_queued_bytes_ = max_queued_bytes;
}

int64_t OpObserver::parts() const {
  return writer_ ? (writer_->forked() ? 0 : writer_->parts()) : closed_counts_.parts;
}
int64_t OpObserver::write_waits() const {
  return writer_ ? (writer_->forked() ? 0 : writer_->write_waits()) : closed_counts_.write_waits;
}

void OpObserver::guard(const at::Tensor& t, Written& written) {
  if (!t.has_storage()) return;
  const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  written.storages.push_back(s);
  {
    std::lock_guard<std::mutex> lock(held_mutex_);
    auto it = held_.find(s);
    if (it != held_.end()) {
      for (auto& [payload, i] : it->second) {
        payload->tensors[i] = payload->tensors[i].clone();
        payload->program[i] = false;
        written.copies.push_back(payload->tensors[i]);
      }
      held_.erase(it);
    }
  }
  if (writer_ && !writer_->forked()) writer_->wait_for(s);  // a part being written holds it
}

void OpObserver::keep_full(std::unique_ptr<Record> r) {
  Payload& pl = *r->payload;
  // Registered and kept in one step under held_mutex_, which hand_over holds while it takes the
  // batch: a record is either handed over with its tensors or guarded, never neither.
  std::lock_guard<std::mutex> lock(held_mutex_);
  r->saved = max_bytes_ < 0 || bytes_written_ + pl.nbytes <= max_bytes_;
  if (!r->saved) {  // past the size cap: indexed without its tensors
    ++dropped_;
    pl.clear();
  } else {
    bytes_written_ += pl.nbytes;
    for (size_t i = 0; i < pl.tensors.size(); ++i)
      if (pl.program[i]) held_[pl.tensors[i].storage().unsafeGetStorageImpl()].emplace_back(&pl, i);
  }
  keep(std::move(r));
}

// payload["unwritten"] as the Python capture writes it: {"inputs": [[k, mask]], "outputs": [...]},
// each only where some tensor holds unwritten elements.
void OpObserver::unwritten_payload(Payload& pl, const std::vector<std::pair<int64_t, at::Tensor>>& in,
                                   const std::vector<at::Tensor>& out) {
  bool any_out = false;
  for (const auto& m : out) any_out = any_out || m.defined();
  if (in.empty() && !any_out) return;
  pl.key("unwritten");
  pl.begin(PayloadToken::DictBegin);
  if (!in.empty()) {
    pl.key("inputs");
    pl.begin(PayloadToken::ListBegin);
    for (const auto& [k, m] : in) {
      pl.begin(PayloadToken::ListBegin);
      pl.push(PayloadToken::Int, k);
      pl.mask(m);
      pl.end();
    }
    pl.end();
  }
  if (any_out) {
    pl.key("outputs");
    pl.begin(PayloadToken::ListBegin);
    for (size_t k = 0; k < out.size(); ++k) {
      if (!out[k].defined()) continue;
      pl.begin(PayloadToken::ListBegin);
      pl.push(PayloadToken::Int, static_cast<int64_t>(k));
      pl.mask(out[k]);
      pl.end();
    }
    pl.end();
  }
  pl.end();
}

std::unique_ptr<Record> OpObserver::take_record() {
  // Cleared records, taken from the writer's pool a batch at a time (one lock, not one per op).
  thread_local std::vector<std::unique_ptr<Record>> spare;
  if (spare.empty()) {
    if (!writer_ || writer_->forked()) return std::make_unique<Record>();
    writer_->take(spare, 256);
  }
  auto r = std::move(spare.back());
  spare.pop_back();
  return r;
}

void OpObserver::keep(std::unique_ptr<Record> r) {
  std::lock_guard<std::mutex> lock(mutex_);
  batch_.push_back(std::move(r));
}

int64_t OpObserver::hand_over() {
  Batch held;
  {
    std::lock_guard<std::mutex> held_lock(held_mutex_);
    std::lock_guard<std::mutex> lock(mutex_);
    held.swap(batch_);
    held_.clear();  // the writer's now: an op writing their storages waits for it (IndexWriter::wait_for)
  }
  if (writer_ && writer_->forked()) return 0;  // the parent's records, or a child's: not this index's
  const auto n = static_cast<int64_t>(held.size());
  if (!writer_) {
    if (n == 0) return 0;
    throw std::runtime_error("the observer holds index lines but no index is open (open_index)");
  }
  // In call order: an op an autograd kernel calls (a detach of a saved result) ends before the op
  // that called it; a module record comes before the op numbered like it. Drained between ops (at
  // steps), so no op is split.
  std::stable_sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a->index < b->index; });
  writer_->submit(std::move(held));
  return n;
}

int64_t OpObserver::drain() {
  const int64_t n = hand_over();
  raise_failure();
  return n;
}

void OpObserver::close_index() {
  if (!writer_) return;
  if (writer_->forked()) {  // the parent's writer: left as it is, leaked (IndexWriter::forked)
    hand_over();
    static_cast<void>(writer_.release());
    return;
  }
  hand_over();
  auto writer = std::move(writer_);
  // its counts outlive it: Python reads them once the capture is closed (meta.json)
  auto counts = [&] { closed_counts_ = {writer->waits(), writer->parts(), writer->write_waits()}; };
  try {
    writer->close();
  } catch (...) {
    counts();
    throw;
  }
  counts();
  raise_failure();
}

int64_t OpObserver::waits() const {
  return writer_ ? (writer_->forked() ? 0 : writer_->waits()) : closed_counts_.waits;
}

const OpFacts* OpObserver::facts(const at::RecordFunction& fn) {
  const char* key = fn.name();
  FactsCache& cache = tl_facts;
  const uint64_t epoch = g_facts_epoch.load(std::memory_order_acquire);
  if (cache.epoch != epoch) {
    cache.slots.fill({nullptr, nullptr});
    cache.epoch = epoch;
  }
  auto& cached = cache.slots[FactsCache::slot(key)];
  if (cached.first == key) return cached.second;
  const OpFacts* found = facts_locked(fn, key);
  if (found != nullptr) cached = {key, found};  // a named scope's name is not an op's: not kept
  return found;
}

const OpFacts* OpObserver::facts_locked(const at::RecordFunction& fn, const char* key) {
  FactsTable& table = facts_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto it = table.by_name.find(key);
  if (it != table.by_name.end() && it->second->name == key) return it->second.get();
  auto name = fn.operator_name();
  if (!name) return nullptr;  // a named scope, not an op
  auto handle = c10::Dispatcher::singleton().findOp(*name);
  if (!handle) return nullptr;
  auto f = std::make_unique<OpFacts>();
  f->name = name->name;
  f->overload = name->overload_name.empty() ? "default" : name->overload_name;
  // Decomposed where its CompositeImplicitAutograd kernel serves the call's autograd key: on a backend
  // with no kernel of its own for the op, unless a CompositeExplicitAutograd one serves every backend (a
  // CompositeExplicitAutogradNonFunctional one does not count: silu_backward has one, CPU and CUDA
  // kernels and a composite one, and is decomposed on PrivateUse1).
  f->implicit = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
                !handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
  for (c10::DispatchKey k : kBackendKeys)
    if (handle->hasKernelForDispatchKey(k)) f->backend_kernels = f->backend_kernels.add(k);
  f->own_autograd = handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd);
  for (c10::DispatchKey k : c10::getRuntimeDispatchKeySet(c10::DispatchKey::Autograd))
    f->own_autograd = f->own_autograd || handle->hasKernelForDispatchKey(k);
  for (const char* a : kAutogradOnly) f->autograd_only = f->autograd_only || f->name == a;
  f->random = handle->hasTag(at::Tag::nondeterministic_seeded);
  for (const char* a : kAllocators) f->allocator = f->allocator || f->name == a;
  f->counted_only = f->name.rfind("profiler::", 0) == 0;
  // as collectives.is_collective; a functional one returns its result before it is there (its
  // plumbing, wait_tensor and _wrap_tensor_autograd, communicates nothing)
  f->collective = f->name.rfind("c10d::", 0) == 0 || f->name.rfind("_c10d_functional::", 0) == 0 ||
                  f->name.rfind("c10d_functional::", 0) == 0;
  f->functional = f->collective && f->name.rfind("c10d::", 0) != 0 &&
                  f->name.find("::wait_tensor") == std::string::npos &&
                  f->name.find("::_wrap_tensor_autograd") == std::string::npos;
  f->point_to_point = f->name == "c10d::send" || f->name == "c10d::recv_" || f->name == "c10d::recv_any_source_";
  for (const char* a : kSameElements) f->same_elements = f->same_elements || f->name == a;
  for (const char* a : kReductions) f->reduction = f->reduction || f->name == a;
  f->shown_name = f->name;
  f->shown_overload = f->overload;
  if (f->name == "aten::_reshape_alias") {
    f->shown_name = "aten::view";
    f->shown_overload = "default";
    f->hidden_arg = 2;  // stride
  }
  const auto& args = handle->schema().arguments();
  bool aliased = false, writes = false;  // as OpOverload.is_view
  for (const auto& a : args)
    if (a.alias_info() != nullptr) aliased = true, writes = writes || a.alias_info()->isWrite();
  f->view = (aliased && !writes) || f->name == "aten::_unsafe_view";
  for (size_t i = 0; i < args.size(); ++i) {
    f->arg_names.push_back(args[i].name());
    f->arg_types.push_back(args[i].real_type());
    bool ignored = false;
    for (const char* n : kIgnored) ignored = ignored || args[i].name() == n;
    f->arg_ignored.push_back(ignored);
    if (args[i].name() == "dropout_p") f->dropout_p = static_cast<int>(i);
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) f->written_args.push_back(static_cast<int>(i));
  }
  for (size_t i = 0; i < args.size(); ++i) f->arg_defaults.push_back(args[i].default_value());
  f->kwarg_only_start = args.size();
  while (f->kwarg_only_start > 0 && args[f->kwarg_only_start - 1].kwarg_only()) --f->kwarg_only_start;
  for (const auto& ret : handle->schema().returns()) f->return_types.push_back(ret.real_type());
  f->first_arg_out = f->name.rfind("c10d::", 0) == 0 && f->return_types.size() == 1 &&
                     f->return_types[0]->kind() == c10::TypeKind::ClassType && !args.empty() &&
                     (!f->point_to_point || f->name == "c10d::send");
  if (f->written_args.empty() && f->collective && f->name.back() == '_' && !args.empty())
    f->written_args.push_back(0);  // in-place collectives (allreduce_, broadcast_ ...) do not annotate it (as opinfo)
  // Keyed by the schema's own name string, which lives as long as the op is registered; a key
  // reused by another op after it is gone fails the name check above and is replaced.
  auto& slot = table.by_name[key];
  if (slot) table.retired.push_back(std::move(slot));
  slot = std::move(f);
  return slot.get();
}

// One argument as signature._value reads it (op_record.cpp writes it).
bool OpObserver::encode(Record& r, const c10::IValue& v) const {
  auto& sig = r.signature;
  Token tok;
  if (v.isNone()) return false;
  if (v.isTensor() && wrapped_number(v.toTensor())) {
    const at::Tensor& t = v.toTensor();
    switch (t.scalar_type()) {
      case at::kLong: tok.kind = Token::Int; tok.i = *t.const_data_ptr<int64_t>(); break;
      case at::kDouble: tok.kind = Token::Double; tok.re = *t.const_data_ptr<double>(); break;
      case at::kBool: tok.kind = Token::Bool; tok.i = *t.const_data_ptr<bool>(); break;
      case at::kComplexDouble: {
        const auto c = *t.const_data_ptr<c10::complex<double>>();
        tok.kind = Token::Complex;
        tok.re = c.real();
        tok.im = c.imag();
        break;
      }
      default:
        tok.kind = Token::Tensor;
        tok.i = static_cast<int64_t>(r.arg_metas.size());
        fill_meta(r.arg_metas.emplace_back(), t);
    }
  } else if (v.isTensor()) {
    if (!v.toTensor().defined()) return false;
    tok.kind = Token::Tensor;
    tok.i = static_cast<int64_t>(r.arg_metas.size());
    fill_meta(r.arg_metas.emplace_back(), v.toTensor());
  } else if (v.isBool()) {
    tok.kind = Token::Bool;
    tok.i = v.toBool();
  } else if (v.isInt() || v.isSymInt()) {
    tok.kind = Token::Int;
    tok.i = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
  } else if (v.isDouble()) {
    tok.kind = Token::Double;
    tok.re = v.toDouble();
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    tok.kind = Token::Complex;
    tok.re = c.real();
    tok.im = c.imag();
  } else if (v.isString()) {
    tok.kind = Token::String;
    tok.i = static_cast<int64_t>(r.strings.size());
    r.strings.emplace_back(v.toStringRef());
  } else if (v.isList() || v.isTuple()) {
    sig.push_back(Token{Token::ListBegin});
    auto item = [&](const c10::IValue& x) {
      if (!encode(r, x)) sig.push_back(Token{Token::Absent});
    };
    if (v.isList()) {
      for (const c10::IValue& x : v.toListRef()) item(x);
    } else {
      for (const c10::IValue& x : v.toTupleRef().elements()) item(x);
    }
    tok.kind = Token::ListEnd;
  } else {
    return false;  // a device, a generator, a script object: not compared
  }
  sig.push_back(tok);
  return true;
}

int64_t OpObserver::unwritten_count(c10::ArrayRef<c10::IValue> inputs) {
  int64_t n = 0;
  for (const auto& v : inputs)
    each_tensor(v, [&](const at::Tensor& t) {
      const at::Tensor m = unwritten_.mask(t);
      if (m.defined()) n += m.sum().item<int64_t>();
    });
  return n;
}

void OpObserver::set_group(const std::string& name, std::vector<int64_t> ranks) {
  std::lock_guard<std::mutex> lock(groups_mutex_);
  groups_[name] = std::move(ranks);
}

void OpObserver::set_reduce_op_name(int64_t value, std::string name) {
  std::lock_guard<std::mutex> lock(groups_mutex_);
  if (value < 0 || value > 255) return;
  if (reduce_op_names_.size() <= static_cast<size_t>(value)) reduce_op_names_.resize(value + 1);
  reduce_op_names_[value] = std::move(name);
}

std::vector<int64_t> OpObserver::group(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(groups_mutex_);
    auto it = groups_.find(name);
    if (it != groups_.end() || !group_ranks_) return it != groups_.end() ? it->second : std::vector<int64_t>{};
  }
  // Made since the last set_group (mid-step): asked of Python without the lock (a thread holding
  // the GIL may be in set_group), then kept.
  std::vector<int64_t> ranks = group_ranks_(name);
  std::lock_guard<std::mutex> lock(groups_mutex_);
  groups_.try_emplace(name, ranks);
  return ranks;
}

// A collective's process group (its global ranks) and ReduceOp, read from its arguments as
// collectives.group_ranks and reduce_op_name read them: a functional collective names both with
// strings (the ReduceOp second, the group's name last).
void OpObserver::collective_args(Record& r, c10::ArrayRef<c10::IValue> inputs) {
  static const auto group_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
  static const auto reduce_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ReduceOp>>();
  if (r.op->name.rfind("c10d::", 0) != 0) {
    if (inputs.size() > 1 && inputs[1].isString()) {
      r.reduce_op = inputs[1].toStringRef();
      for (char& c : r.reduce_op) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    for (size_t i = inputs.size(); i-- > 0;)
      if (inputs[i].isString()) {
        r.group = group(inputs[i].toStringRef());
        break;
      }
    return;
  }
  for (const auto& v : inputs) {
    if (!v.isCustomClass()) continue;
    if (v.type() == group_type) {
      r.group = group(v.toCustomClass<c10d::ProcessGroup>()->getGroupName());
    } else if (v.type() == reduce_type) {
      std::lock_guard<std::mutex> lock(groups_mutex_);
      const auto op = static_cast<size_t>(v.toCustomClass<c10d::ReduceOp>()->op_);
      if (op < reduce_op_names_.size()) r.reduce_op = reduce_op_names_[op];
    }
  }
}

at::Tensor OpObserver::readable(const at::Tensor& t) const {
  if (!t.key_set().has(c10::DispatchKey::Python) || !readable_) return t;
  return readable_(t);
}

void OpObserver::set_step(int64_t step) {
  step_ = step;
  std::lock_guard<std::mutex> lock(known_mutex_);
  known_.clear();
  storage_writes_.clear();
}

uint64_t OpObserver::storage_writes(const at::Tensor& t) const {
  if (!t.has_storage()) return 0;
  auto it = storage_writes_.find(t.storage().unsafeGetStorageImpl());
  return it == storage_writes_.end() ? 0 : it->second;
}

void OpObserver::wrote(const at::Tensor& t) {
  if (!t.has_storage()) return;
  std::lock_guard<std::mutex> lock(known_mutex_);
  if (storage_writes_.size() >= (1u << 16)) known_.clear(), storage_writes_.clear();  // a loop that never steps
  ++storage_writes_[t.storage().unsafeGetStorageImpl()];
}

const FusedStats* OpObserver::known(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_inference()) return nullptr;  // no version counter
  auto it = known_.find(impl);
  if (it == known_.end() || it->second.ref.expired() || it->second.version != impl->version_counter().current_version()
      || it->second.storage_writes != storage_writes(t))
    return nullptr;
  return &it->second.stats;
}

void OpObserver::remember(const at::Tensor& t, const FusedStats& s) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_inference() || !s.supported) return;
  if (known_.size() >= (1u << 16)) known_.clear();  // a loop that never steps
  known_.insert_or_assign(
      impl, Known{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
                  static_cast<int64_t>(impl->version_counter().current_version()), storage_writes(t), s});
}

OutStats OpObserver::stats(const at::Tensor& t, const at::Tensor* source, const at::Tensor& unwritten) {
  OutStats o;
  if (t.numel() == 0 || !floating_or_int(t.scalar_type())) return o;
  o.counted = true;
  FusedStats& s = o.s;
  at::Tensor zeroed;  // with unwritten elements: statistics of its own, neither reused nor kept
  if (unwritten.defined()) {
    zeroed = t.detach().masked_fill(unwritten.to(t.device()), 0);
    elements_read_ += t.numel();
    s = fused_stats(zeroed);
  } else {
    std::lock_guard<std::mutex> lock(known_mutex_);
    const FusedStats* hit = known(t);
    if (hit == nullptr && source != nullptr) hit = known(*source);
    if (hit == nullptr) elements_read_ += t.numel();
    s = hit != nullptr ? *hit : fused_stats(t);
    remember(t, s);
  }
  if (!s.supported) {  // a device tensor or a dtype the pass does not read: a float64 copy on the CPU
    s = fused_stats((zeroed.defined() ? zeroed : t).detach().to(at::kCPU, at::kDouble));
  }
  return o;
}

const std::string* OpObserver::current_module(bool in_backward, bool* in_module) const {
  // modules_ is pushed and popped by module hooks that may run on another thread than this op's
  std::lock_guard<std::mutex> lock(tags_mutex_);
  *in_module = !modules_.empty();
  if (*in_module) return modules_.back();
  if (!in_backward) return nullptr;
  auto node = torch::autograd::get_current_node();
  if (!node) return nullptr;
  if (node->sequence_nr() == UINT64_MAX) {
    auto it = leaf_paths_.find(node.get());
    return it == leaf_paths_.end() || it->second.first.expired() ? nullptr : it->second.second;
  }
  auto it = node_paths_.find(node->sequence_nr());
  return it == node_paths_.end() ? nullptr : it->second;
}

void OpObserver::module_record(const std::string& op, const std::string& phase, const std::string& module,
                               int64_t step, const std::vector<at::Tensor>& tensors) {
  InHook in_hook;  // a device tensor's float64 copy is no op of the program
  auto r = take_record();
  r->index = count_;
  r->module_op = op;
  r->module_phase = phase;
  if (!module.empty()) {
    std::lock_guard<std::mutex> lock(tags_mutex_);
    r->module = intern(module);
  }
  r->step = step;
  r->rank = rank_;
  std::vector<at::Tensor> readables, masks;
  for (const auto& wrapped : tensors) {
    fill_meta(r->outputs.emplace_back(), wrapped);
    const at::Tensor t = readable(wrapped);
    const at::Tensor mask = unwritten_.empty() ? at::Tensor() : unwritten_.mask(t);
    if (mask.defined()) r->unwritten += mask.sum().item<int64_t>();
    if (full_) {
      readables.push_back(t);
      masks.push_back(mask);
    } else {
      r->stats.push_back(stats(t, nullptr, mask));
    }
  }
  if (full_) {  // {"args": (), "kwargs": {}, "outputs": [tensors], "unwritten": ...} under key mNNNNNNN
    r->full = true;
    if (!r->payload) r->payload = std::make_unique<Payload>();
    Payload& pl = *r->payload;
    pl.begin(PayloadToken::DictBegin);
    pl.key("args");
    pl.begin(PayloadToken::TupleBegin);
    pl.end();
    pl.key("kwargs");
    pl.begin(PayloadToken::DictBegin);
    pl.end();
    pl.key("outputs");
    pl.begin(PayloadToken::ListBegin);
    for (const auto& t : readables) pl.tensor(t, nullptr);
    pl.end();
    unwritten_payload(pl, {}, masks);
    pl.end();
    char key[24];
    std::snprintf(key, sizeof key, "m%07lld", static_cast<long long>(module_records_++));
    r->key = key;
    keep_full(std::move(r));
    return;
  }
  keep(std::move(r));
}

// Inside a recorded op's kernel: below autograd (the autograd keys or ADInplaceOrView excluded: an
// in-place _foreach_* op has no ADInplaceOrView kernel, its slow path's per-tensor ops run with only
// the autograd keys excluded), or anywhere inside an op that no autograd kernel of its own ran for
// (runs_autograd: torch's autograd fallback, or no autograd key at all, calls its kernel with no key
// excluded).
bool OpObserver::nested() const {
  if (tl_depth == 0) return false;
  if (tl_sealed > 0) return true;
  const c10::DispatchKeySet excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
  return excluded.has(c10::DispatchKey::ADInplaceOrView) || excluded.has(c10::DispatchKey::AutogradFunctionality);
}

// Which calls a Python dispatch mode would show, told apart without one:
// - a composite op is decomposed above the Python key: its parts are shown, not it;
// - a call made with the Python key excluded (tensor construction from data) is not shown;
// - a call made inside a recorded op's kernel (below autograd: nested()) is not shown (the mode is
//   off while its handler runs the op), but one its autograd kernel makes is.
std::unique_ptr<at::ObserverContext> OpObserver::on_start(const at::RecordFunction& fn) {
  if (tl_in_hook || paused_.load(std::memory_order_relaxed) > 0) return nullptr;
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python)) return nullptr;
  const OpFacts* op = facts(fn);
  if (op == nullptr) return nullptr;
  if (composite_on(*op, fn.inputs())) {
    if (backend_dependent(*op)) tl_composite.push_back(true);
    return nullptr;
  }
  if (nested()) {  // no context (an allocation per inner call): on_end finds it nested again
    if (backend_dependent(*op)) tl_composite.push_back(false);
    ++tl_depth;
    return nullptr;
  }
  if (op->counted_only) {
    ++count_;
    return nullptr;
  }
  ++tl_depth;
  InHook in_hook;
  auto p = std::make_unique<Pending>();
  p->uncaught = std::uncaught_exceptions();
  if (!runs_autograd(*op, fn.inputs())) {
    p->sealed = true;
    ++tl_sealed;
  }
  if (op->collective && !op->point_to_point) {
    p->muted = true;
    p->was_enabled = at::isRecordFunctionEnabled();
    at::enableRecordFunction(false);
  }
  // A context is returned even when the op cannot be described, so that on_end undoes tl_depth (torch
  // catches a callback's exception, calls on_end without a context and goes on: the depth would stay
  // raised and later top-level ops would be taken for inner ones).
  try {
    if (any_unread_.load(std::memory_order_relaxed) && !op->view) read_touched(fn.inputs());
    start_record(fn, *op, *p);
  } catch (const std::exception& e) {
    failed(*op, e.what());
    p->record.reset();
  }
  return p;
}

void OpObserver::start_record(const at::RecordFunction& fn, const OpFacts& facts, Pending& pending) {
  const OpFacts* op = &facts;
  Pending* p = &pending;
  const auto inputs = fn.inputs();
  if (op->same_elements && !inputs.empty() && inputs[0].isTensor()) p->source = inputs[0].toTensor();
  if (op->reduction && !full_ && !inputs.empty() && inputs[0].isTensor()) p->reduced = inputs[0].toTensor();
  Written written;
  for (int i : op->written_args)
    if (static_cast<size_t>(i) < inputs.size())
      each_tensor(inputs[i], [&](const at::Tensor& t) {
        wrote(t);  // statistics kept of other tensors over what it writes are stale
        if (full_) guard(t, written);  // what a kept record holds uncopied: copied, or its part written
      });
  if (full_ && !unwritten_.empty()) {  // each input's mask, for the payload
    int64_t k = 0;
    for (const auto& v : inputs)
      each_tensor(v, [&](const at::Tensor& t) {
        at::Tensor m = unwritten_.mask(t);
        if (m.defined()) {
          p->in_unwritten += m.sum().item<int64_t>();
          p->in_masks.emplace_back(k, std::move(m));
        }
        ++k;
      });
  }
  if (!unwritten_.empty()) {  // read here: the inputs are not there any more when the op ends
    if (!full_) p->in_unwritten = unwritten_count(inputs);
    for (int i : op->written_args)
      if (static_cast<size_t>(i) < inputs.size())
        each_tensor(inputs[i], [&](const at::Tensor& t) { p->written.push_back(t); });
  }
  p->record = take_record();
  Record& r = *p->record;
  r.op = op;
  r.index = count_++;
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  bool in_module = false;
  r.module = current_module(in_backward, &in_module);
  r.phase = in_optimizer_ ? "optimizer" : in_backward ? (in_module ? "recompute" : "backward") : "forward";
  r.step = step_;
  r.rank = rank_;
  for (const auto& v : inputs) each_tensor(v, [&](const at::Tensor& t) { fill_meta(r.inputs.emplace_back(), t); });
  for (size_t i = 0; i < inputs.size(); ++i) {
    if ((i < op->arg_ignored.size() && op->arg_ignored[i]) || static_cast<int>(i) == op->hidden_arg) continue;
    r.signature.push_back(Token{Token::Arg, static_cast<int64_t>(i)});
    if (!encode(r, inputs[i])) r.signature.pop_back();  // no value: left out
  }
  if (op->random) {
    bool drew = true;
    if (op->dropout_p >= 0 && static_cast<size_t>(op->dropout_p) < inputs.size()) {
      const auto& d = inputs[op->dropout_p];
      drew = !((d.isDouble() && d.toDouble() == 0) || (d.isInt() && d.toInt() == 0));
    }
    r.random = drew ? 1 : 0;
  }
  if (op->collective) collective_args(r, inputs);
  if (op->first_arg_out && !inputs.empty()) p->first_arg = inputs[0];
  if (op->point_to_point && transfer_) {  // a send's bytes are read before it is issued
    std::vector<c10::IValue> args(inputs.begin(), inputs.end());
    if (op->name == "c10d::send")
      transfer(r, args, c10::IValue());
    else
      p->transfer_args = std::move(args);
  }
  if (full_) {  // what an op writes is copied now, as it was before it
    r.full = true;
    if (!r.payload) r.payload = std::make_unique<Payload>();
    r.payload->readable = readable_ ? &readable_ : nullptr;
    r.payload->arguments(*op, inputs, op->written_args.empty() ? nullptr : &written);
  }
}

void OpObserver::transfer(const Record& r, const std::vector<c10::IValue>& args, const c10::IValue& out) {
  watch(transfer_(r, args, out));
}

void OpObserver::watch(const std::vector<int64_t>& unread) {
  std::lock_guard<std::mutex> lock(unread_mutex_);
  unread_.clear();
  unread_.insert(unread.begin(), unread.end());
  any_unread_ = !unread_.empty();
}

void OpObserver::read_touched(c10::ArrayRef<c10::IValue> inputs) {
  std::vector<at::Tensor> touched;
  {
    std::lock_guard<std::mutex> lock(unread_mutex_);
    for (const auto& v : inputs)
      each_tensor(v, [&](const at::Tensor& t) {
        if (t.has_storage() && unread_.count(reinterpret_cast<int64_t>(t.storage().data())) > 0) touched.push_back(t);
      });
  }
  if (!touched.empty()) watch(touched_(touched));
}

void OpObserver::failed(const OpFacts& op, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_.empty())
    failure_ = "capture: " + op.name + "." + op.overload + " could not be recorded by the C++ observer (" + what +
               "); hook='python' describes what it can, or leave the op out of the capture";
}

void OpObserver::raise_failure() {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure.swap(failure_);
  }
  if (!failure.empty()) throw std::runtime_error(failure);
}

void OpObserver::on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) {
    // Not recorded. Nested (counted in tl_depth by on_start) iff on_start's tests give the same
    // answers now: the dispatch-key guards and the pause are scoped around the call.
    if (tl_in_hook || paused_.load(std::memory_order_relaxed) > 0 ||
        c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python))
      return;
    const OpFacts* op = facts(fn);
    if (op == nullptr) return;
    bool composite = composite_on(*op, {});  // (not backend_dependent: the inputs are not read)
    if (backend_dependent(*op)) {
      if (tl_composite.empty()) return;  // no answer kept: on_start saw the call otherwise
      composite = tl_composite.back();
      tl_composite.pop_back();
    }
    if (!composite && nested()) --tl_depth;
    return;
  }
  --tl_depth;
  auto* p = static_cast<Pending*>(ctx);
  if (p->sealed) --tl_sealed;
  if (p->muted) at::enableRecordFunction(p->was_enabled);
  if (p->record == nullptr) return;  // not described (failed)
  if (std::uncaught_exceptions() > p->uncaught) return;  // the op raised
  InHook in_hook;
  const OpFacts* op = p->record->op;
  try {
    end_record(fn, *p);
  } catch (const std::exception& e) {
    failed(*op, e.what());
  }
}

void OpObserver::end_record(const at::RecordFunction& fn, Pending& pending) {
  Pending* p = &pending;
  Record& r = *p->record;
  if (!p->transfer_args.empty()) {  // a receive issued: its Work tells an any-source one's peer
    const auto& returns = fn.outputs();
    transfer(r, p->transfer_args, returns.size() == 1 ? returns[0] : c10::IValue());
    p->transfer_args.clear();
  }
  auto& outputs = tl_outputs;
  outputs.clear();
  each_tensor(p->first_arg, [&](const at::Tensor& t) { outputs.push_back(t); });
  for (const auto& v : fn.outputs()) each_tensor(v, [&](const at::Tensor& t) { outputs.push_back(t); });
  if (r.op->functional) {  // waited for as the engine would: the program's own wait is then a no-op
    static const auto wait = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("_c10d_functional::wait_tensor", "")
                                 .typed<at::Tensor(const at::Tensor&)>();
    for (const auto& t : outputs) wait.call(t);
  } else if (r.op->collective && !r.op->point_to_point) {  // its outputs hold the result once it completed
    for (const auto& v : fn.outputs()) {
      if (v.isCustomClass() && v.type() == c10::getCustomClassType<c10::intrusive_ptr<c10d::Work>>()) {
        auto work = v.toCustomClass<c10d::Work>();
        if (!work->isCompleted()) work->wait();
      }
    }
  }
  for (auto& t : outputs) {
    fill_meta(r.outputs.emplace_back(), t);
    t = readable(t);  // what is read of it from here on
  }
  // What empty* allocated and no op wrote since (through any view) counts as 0, as the Python hook
  // writes it: an allocator's outputs, then the writes of this op, then what its tensors still hold.
  if (r.op->allocator) {
    for (const auto& t : outputs) unwritten_.allocated(t);
  } else {
    for (const auto& t : p->written) unwritten_.written(t);
  }
  auto& masks = tl_masks;
  masks.assign(outputs.size(), at::Tensor());
  if (!unwritten_.empty() || p->in_unwritten > 0) {  // (a write may have emptied it)
    r.unwritten = p->in_unwritten;  // a count: never negative
    for (size_t i = 0; i < outputs.size(); ++i) {
      masks[i] = unwritten_.mask(outputs[i]);
      if (masks[i].defined()) r.unwritten += masks[i].sum().item<int64_t>();
    }
  }
  if (r.full) {
    Payload& pl = *r.payload;
    pl.key("outputs");
    const auto& returns = fn.outputs();
    auto type = [&](size_t i) { return i < r.op->return_types.size() ? r.op->return_types[i] : c10::TypePtr(); };
    if (returns.empty()) {
      pl.push(PayloadToken::None);
    } else if (r.op->first_arg_out || r.op->point_to_point) {
      // (what it wrote, its Work), as the Python hook saves a c10d op that returns only its Work; a
      // receive's data is not known yet (never waited for): an empty list in its place
      pl.begin(PayloadToken::TupleBegin);
      if (r.op->first_arg_out) {
        pl.value(p->first_arg, r.op->arg_types.empty() ? c10::TypePtr() : r.op->arg_types[0], nullptr);
      } else {
        pl.begin(PayloadToken::ListBegin);
        pl.end();
      }
      pl.value(returns[0], type(0), nullptr);
      pl.end();
    } else if (returns.size() == 1) {
      pl.value(returns[0], type(0), nullptr);
    } else {
      pl.begin(PayloadToken::TupleBegin);
      for (size_t i = 0; i < returns.size(); ++i) pl.value(returns[i], type(i), nullptr);
      pl.end();
    }
    unwritten_payload(pl, p->in_masks, masks);
    pl.end();
    char key[24];
    std::snprintf(key, sizeof key, "%07lld", static_cast<long long>(r.index));
    r.key = key;
    masks.clear();
    outputs.clear();
    keep_full(std::move(p->record));
    return;
  }
  if (r.op->collective) {  // it wrote its outputs without moving their version counters: not reused
    std::lock_guard<std::mutex> lock(known_mutex_);
    for (const auto& t : outputs) known_.erase(t.unsafeGetTensorImpl());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    const bool same = p->source.defined() && outputs.size() == 1 && p->source.numel() == t.numel() &&
                      p->source.scalar_type() == t.scalar_type();
    r.stats.push_back(stats(t, same ? &p->source : nullptr, masks[i]));
  }
  if (p->reduced.defined()) {
    fill_meta(r.input_meta, p->reduced);
    const at::Tensor t = readable(p->reduced);
    r.input_stats = stats(t, nullptr, unwritten_.empty() ? at::Tensor() : unwritten_.mask(t));
    r.has_input_stats = true;
  }
  masks.clear();
  outputs.clear();
  keep(std::move(p->record));
}

}  // namespace ditorch_precision
