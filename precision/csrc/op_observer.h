// The C++ op observer of a stats capture: a RecordFunction callback on this thread (and on the
// autograd threads that inherit its state) that sees the ATen ops a Python dispatch mode would see,
// and per op keeps its capture index line (name, call number, phase, module, step, rank, argument
// metadata and values, and each output's fused statistics) as a binary record (op_record.h). At
// each drain the records go, in call order, to an IndexWriter, whose thread writes their text.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/edge.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include "fused_stats.h"
#include "index_writer.h"
#include "op_record.h"
#include "unwritten_memory.h"

namespace ditorch_precision {

// torch 2.13 holds autograd nodes by intrusive_ptr, earlier releases by shared_ptr: a weak reference of
// whichever kind an Edge holds.
template <class P>
struct WeakOf;
template <class T>
struct WeakOf<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T, class N>
struct WeakOf<c10::intrusive_ptr<T, N>> {
  using type = c10::weak_intrusive_ptr<T, N>;
};
using WeakNode = WeakOf<decltype(torch::autograd::Edge::function)>::type;

struct Pending;  // an op's record between its start and its end (op_observer.cpp)

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
  void push_module(const std::string& path);
  void pop_module();
  void set_optimizer(bool on) { in_optimizer_ = on; }
  // A new step: the statistics kept for reuse are dropped (they bound its memory).
  void set_step(int64_t step);
  void set_rank(int64_t rank) { rank_ = rank; }
  // A tool's own ops (quiet blocks) are not the program's: paused while > 0.
  void pause() { ++paused_; }
  void resume() { --paused_; }

  // A module record (capture's module outputs, their gradients, the parameters after a step): the
  // index line of `tensors` under `op` ("module::output"), numbered as the next op.
  void module_record(const std::string& op, const std::string& phase, const std::string& module, int64_t step,
                     const std::vector<at::Tensor>& tensors);

  // The index file the records are written to (appended), by a thread of its own holding at most
  // `max_queued` records; before start.
  void open_index(const std::string& path, size_t max_queued);
  // Hands the records kept since the last drain, in call order, to the index's thread; how many.
  // Raises the thread's write error, if any, then an op that could not be recorded (failed).
  int64_t drain();
  // Drains, then waits until every line is written and closes the file (raising a write error, then
  // an op that could not be recorded).
  void close_index();
  int64_t waits() const;  // drains that waited for the index's thread (its queue was full)

  // Full capture (before open_index): each op's arguments and outputs are kept (op_payload.h) and
  // written to part files under `parts_dir` by the index's thread, a part closed past `part_bytes`;
  // past `max_bytes` of tensors (< 0: no cap) ops are indexed without them; the queue holds at most
  // `max_queued_bytes` of them.
  void set_full(const std::string& parts_dir, int64_t part_bytes, int64_t max_bytes, int64_t max_queued_bytes);
  int64_t bytes_written() const { return bytes_written_; }
  int64_t dropped() const { return dropped_; }  // records indexed without their tensors (the cap)
  int64_t parts() const;
  int64_t write_waits() const;  // ops that waited for a part holding what they write

  // A process group's global ranks, by its name (ProcessGroup::getGroupName), as torch.distributed
  // knows them; and the names of ReduceOp's values: a collective's "group" and "reduce_op".
  void set_group(const std::string& name, std::vector<int64_t> ranks);
  void set_reduce_op_name(int64_t value, std::string name);
  int64_t count() const { return count_; }  // ops seen (the call numbers handed out)
  // Elements the statistics pass has read (a statistic reused from a tensor seen unchanged reads none).
  int64_t elements_read() const { return elements_read_; }
  // What only Python knows (module.cpp calls Python under the GIL): the plain tensor holding the
  // elements of a Python wrapper subclass, such as a functional collective's AsyncCollectiveTensor
  // (dump.readable), and a group's global ranks by name, for a group made after the last set_group
  // (collectives.ranks_by_name; empty: not known). Set before start.
  using Readable = std::function<at::Tensor(const at::Tensor&)>;
  using GroupRanks = std::function<std::vector<int64_t>(const std::string&)>;
  void set_python_side(Readable readable, GroupRanks group_ranks) {
    readable_ = std::move(readable);
    group_ranks_ = std::move(group_ranks);
  }

  // Point-to-point transfers, recorded by Python in the capture's TransferLog as the Python hook
  // records them (native_hook.hand_transfers): `transfer` at a send's start (before it is issued;
  // out: None) and at a receive's end (out: its Work); `touched` with an op's tensors on the storage
  // of a received buffer not read yet, before the op (not a view) runs. Each returns the storages
  // (addresses) of the buffers still unread. module.cpp calls Python under the GIL. Set before start.
  using Transfer =
      std::function<std::vector<int64_t>(const Record&, const std::vector<c10::IValue>& args, const c10::IValue& out)>;
  using Touched = std::function<std::vector<int64_t>(const std::vector<at::Tensor>&)>;
  void set_transfers(Transfer transfer, Touched touched) {
    transfer_ = std::move(transfer);
    touched_ = std::move(touched);
  }

  // Names of the dtypes as the index writes them (torch.float32 -> "float32"), set from Python.
  void set_dtype_name(c10::ScalarType dtype, std::string name) { dtype_names_.set(dtype, std::move(name)); }

  // The observer the callbacks report to (one at a time: Python allows one C++-hooked capture).
  static OpObserver*& current();

  // Called by the RecordFunction callbacks.
  std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
  void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx);

 private:
  const OpFacts* facts(const at::RecordFunction& fn);  // cached per thread (op_observer.cpp)
  static const OpFacts* facts_locked(const at::RecordFunction& fn, const char* key);
  void start_record(const at::RecordFunction& fn, const OpFacts& op, Pending& p);
  void end_record(const at::RecordFunction& fn, Pending& p);
  // An op the observer could not describe (a tensor without sizes: nested, symbolic): the first is
  // kept, and raised by the next drain (after its records are handed over) or by close_index.
  void failed(const OpFacts& op, const char* what);
  void raise_failure();
  int64_t hand_over();  // drain without raise_failure
  // An argument as signature._value reads it, appended to r's signature; false (nothing appended)
  // for what it leaves out (None, devices, generators, objects).
  bool encode(Record& r, const c10::IValue& v) const;
  // t's statistics. source: a tensor holding exactly t's elements (a view's input), whose statistics
  // are t's if known; unwritten (if defined): a mask of t's elements counted as 0
  OutStats stats(const at::Tensor& t, const at::Tensor* source, const at::Tensor& unwritten);
  const FusedStats* known(const at::Tensor& t);
  void remember(const at::Tensor& t, const FusedStats& s);
  const std::string* current_module(bool in_backward, bool* in_module) const;  // takes tags_mutex_
  const std::string* intern(const std::string& path);  // with tags_mutex_ held
  std::unique_ptr<Record> take_record();
  void keep(std::unique_ptr<Record> r);  // a finished record, until the next drain
  bool nested() const;
  int64_t unwritten_count(c10::ArrayRef<c10::IValue> inputs);  // their tensors' unwritten elements

  at::CallbackHandle handle_ = 0;
  std::atomic<int64_t> count_{0};
  std::atomic<int> paused_{0};
  std::atomic<bool> in_optimizer_{false};
  std::atomic<int64_t> step_{0}, rank_{0};
  std::vector<const std::string*> modules_;
  // Module paths, each once; never freed nor moved while the observer lives (queued records
  // point at them; a deque keeps its elements in place).
  std::deque<std::string> paths_;
  std::unordered_map<std::string_view, const std::string*> path_ids_;
  std::unordered_map<uint64_t, const std::string*> node_paths_;  // autograd node sequence number -> path
  // Nodes without a sequence number (AccumulateGrad) -> path, while the node lives.
  std::unordered_map<const torch::autograd::Node*,
                     std::pair<WeakNode, const std::string*>> leaf_paths_;
  mutable std::mutex tags_mutex_;
  mutable std::mutex mutex_;  // batch_ (backward may run on an autograd thread)
  Batch batch_;  // records finished since the last drain
  std::string failure_;  // with mutex_ held
  std::unique_ptr<IndexWriter> writer_;
  struct Counts {
    int64_t waits = 0, parts = 0, write_waits = 0;
  } closed_counts_;  // the writer's, once closed
  DtypeNames dtype_names_;
  std::unordered_map<std::string, std::vector<int64_t>> groups_;
  std::vector<std::string> reduce_op_names_;
  std::mutex groups_mutex_;
  Readable readable_;
  GroupRanks group_ranks_;
  void collective_args(Record& r, c10::ArrayRef<c10::IValue> inputs);
  Transfer transfer_;
  Touched touched_;
  void transfer(const Record& r, const std::vector<c10::IValue>& args, const c10::IValue& out);
  void read_touched(c10::ArrayRef<c10::IValue> inputs);  // before an op: the unread buffers it reaches
  void watch(const std::vector<int64_t>& unread);  // the storages of the buffers still unread
  std::mutex unread_mutex_;
  std::unordered_set<int64_t> unread_;
  std::atomic<bool> any_unread_{false};
  std::vector<int64_t> group(const std::string& name);  // takes groups_mutex_; asks Python on a miss
  at::Tensor readable(const at::Tensor& t) const;  // t, or what holds its elements (a Python wrapper's)
  // Statistics computed this step, by tensor: a tensor seen again unchanged (a module's output is an
  // op's output) or a view holding exactly its input's elements takes them instead of a pass.
  // Weak references: the program's tensors are freed as they would be, and an entry's address is
  // not reused while it is held. Checked by the version counter (a write moves it) and by the writes
  // its storage took since: a write through another tensor over it (`.data`, whose version counter is
  // its own) moves no version counter of this one.
  struct Known {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> ref;
    int64_t version;
    uint64_t storage_writes;
    FusedStats stats;
  };
  std::unordered_map<const c10::TensorImpl*, Known> known_;
  // Ops that wrote each storage this step (their arguments annotated as written), for Known.
  std::unordered_map<const c10::StorageImpl*, uint64_t> storage_writes_;
  uint64_t storage_writes(const at::Tensor& t) const;  // under known_mutex_
  void wrote(const at::Tensor& t);  // takes known_mutex_
  UnwrittenMemory unwritten_;  // what empty* allocated and no op has written since
  // Full capture.
  bool full_ = false;
  std::string parts_dir_;
  int64_t part_bytes_ = 0, max_bytes_ = -1, max_queued_bytes_ = 0;
  std::atomic<int64_t> bytes_written_{0}, dropped_{0}, module_records_{0};
  std::atomic<int64_t> elements_read_{0};
  // The program's tensors records kept since the last drain hold uncopied, by storage: copied
  // before an op writes that storage (guard), as bulk.PendingWrites does.
  std::unordered_map<const c10::StorageImpl*, std::vector<std::pair<Payload*, size_t>>> held_;
  std::mutex held_mutex_;
  void guard(const at::Tensor& t, Written& written);  // adds t's storage and the copies made to `written`
  // keep() for a full record: its payload's bytes counted against the cap (over it: emptied, saved
  // false) and its program tensors registered with held_.
  void keep_full(std::unique_ptr<Record> r);
  static void unwritten_payload(Payload& pl, const std::vector<std::pair<int64_t, at::Tensor>>& in,
                                const std::vector<at::Tensor>& out);
  std::mutex known_mutex_;
};

}  // namespace ditorch_precision
