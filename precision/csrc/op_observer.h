// The C++ op observer of a stats capture: a RecordFunction callback on this thread (and on the
// autograd threads that inherit its state) that sees the ATen ops a Python dispatch mode would see,
// and per op writes its capture index line (name, call number, phase, module, step, rank, argument
// metadata and values, and each output's fused statistics) into a buffer Python drains.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fused_stats.h"

namespace ditorch_precision {

struct OpFacts;  // what the observer reads once from an op's schema (op_observer.cpp)

class OpObserver {
 public:
  OpObserver();
  ~OpObserver();
  OpObserver(const OpObserver&) = delete;
  OpObserver& operator=(const OpObserver&) = delete;

  void start();  // adds the callback on the calling thread (once)
  void stop();   // removes it

  // Context Python keeps current: the module stack (forward hooks), optimizer, step, rank.
  // The module path of the autograd nodes a module's forward created (sequence number >= seq_start,
  // reachable from its outputs; the first path given to a node stays, as inner modules return
  // first): the module of the ops its backward runs, as tracking.ModuleTracker tags them for the
  // Python hook, kept here by sequence number (never reused within a thread), without Python.
  void tag(const std::vector<at::Tensor>& outputs, const std::string& path, uint64_t seq_start);
  void push_module(std::string path);
  void pop_module();
  void set_optimizer(bool on) { in_optimizer_ = on; }
  // A new step: the statistics kept for reuse are dropped (they bound its memory).
  void set_step(int64_t step);
  void set_rank(int64_t rank) { rank_ = rank; }
  // A tool's own ops (quiet blocks) are not the program's: paused while > 0.
  void pause() { ++paused_; }
  void resume() { --paused_; }

  // A module record (capture's module outputs, their gradients, the parameters after a step): the
  // index line of `tensors` under `op` ("module::output"), numbered as the next op, in the buffer.
  void module_record(const std::string& op, const std::string& phase, const std::string& module, int64_t step,
                     const std::vector<at::Tensor>& tensors);

  // The index lines written since the last drain, in call order, each ending in a newline; and how many.
  std::pair<std::string, int64_t> drain();
  int64_t count() const { return count_; }  // ops seen (the call numbers handed out)

  // Names of the dtypes as the index writes them (torch.float32 -> "float32"), set from Python.
  void set_dtype_name(c10::ScalarType dtype, std::string name);

  // The observer the callbacks report to (one at a time: Python allows one C++-hooked capture).
  static OpObserver*& current();

  // Called by the RecordFunction callbacks.
  std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
  void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx);

 private:
  const OpFacts* facts(const at::RecordFunction& fn);
  std::string_view dtype_name(c10::ScalarType dtype) const;
  void tensor_meta(std::string& out, const at::Tensor& t, bool with_device) const;
  void value(std::string& out, const c10::IValue& v, const c10::TypePtr& type, bool& written) const;
  void signature(std::string& out, const OpFacts& op, c10::ArrayRef<const c10::IValue> inputs) const;
  // zeroed: as if all 0; source: a tensor holding exactly t's elements (a view's input), whose
  // statistics are t's if known
  void stats(std::string& out, const at::Tensor& t, bool zeroed, const at::Tensor* source = nullptr);
  const FusedStats* known(const at::Tensor& t);
  void remember(const at::Tensor& t, const FusedStats& s);
  std::string current_module(bool in_backward) const;
  // An index line's opening fields, shared by op and module records: index .. "api": null.
  void line_head(std::string& out, int64_t index, std::string_view op, std::string_view overload,
                 std::string_view phase, const std::string& module, int64_t step) const;
  bool nested() const;

  at::CallbackHandle handle_ = 0;
  std::atomic<int64_t> count_{0};
  std::atomic<int> paused_{0};
  std::atomic<bool> in_optimizer_{false};
  std::atomic<int64_t> step_{0}, rank_{0};
  std::vector<std::string> modules_;
  std::unordered_map<uint64_t, int> node_paths_;  // autograd node sequence number -> index in paths_
  std::unordered_map<std::string, int> path_ids_;
  std::vector<std::string> paths_;
  mutable std::mutex tags_mutex_;
  mutable std::mutex mutex_;  // lines_ (backward may run on an autograd thread)
  std::vector<std::pair<int64_t, std::string>> lines_;  // (call number, index line)
  std::vector<std::string> spare_;  // drained lines' buffers, cleared, kept for their capacity
  std::unordered_map<const char*, std::unique_ptr<OpFacts>> facts_;  // by the schema's name (one per overload)
  std::mutex facts_mutex_;
  std::vector<std::string> dtype_names_;
  // Statistics computed this step, by tensor: a tensor seen again unchanged (a module's output is an
  // op's output) or a view holding exactly its input's elements takes them instead of a pass.
  // Weak references: the program's tensors are freed as they would be, and an entry's address is
  // not reused while it is held. Checked by the version counter (a write moves it).
  struct Known {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> ref;
    int64_t version;
    FusedStats stats;
  };
  std::unordered_map<const c10::TensorImpl*, Known> known_;
  std::mutex known_mutex_;
};

}  // namespace ditorch_precision
