#include "backend.h"

#include <c10/util/Logging.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "collectives/collectives.h"
#include "errors.h"
#include "staging.h"
#include "store_adapter.h"
#include "work.h"

namespace dicomm::torch_backend {
namespace {

using c10d::OpType;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// The work type of a coalesced reduce-scatter: its own in recent torch (2.13), COALESCED in older releases.
template <class E>
constexpr auto reduce_scatter_coalesced_type(int) -> decltype(E::REDUCE_SCATTER_TENSOR_COALESCED) {
  return E::REDUCE_SCATTER_TENSOR_COALESCED;
}
template <class E>
constexpr E reduce_scatter_coalesced_type(long) {
  return E::COALESCED;
}

// Tags the backend uses itself: torch's tags are ints, so everything from 2**32 up is free.
constexpr Tag kMonitoredBarrierTag = Tag{1} << 40;

DataType engine_dtype(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kByte: return DataType::kUInt8;
    case at::kBool: return DataType::kBool;
    default:
      bad_argument(op, std::string("cannot reduce tensors of dtype ") + c10::toString(t) +
                           "; supported: float32, float64, float16, bfloat16, int8, int16, int32, "
                           "int64, uint8, bool");
  }
}

// The engine op for a torch ReduceOp, and the factor of PREMUL_SUM (1 otherwise).
dicomm::ReduceOp engine_op(const c10d::ReduceOp& op, at::ScalarType dtype, const char* name,
                           double* factor, at::Tensor* tensor_factor) {
  *factor = 1.0;
  using R = c10d::ReduceOp::RedOpType;
  const bool floating = at::isFloatingType(dtype) || at::isComplexType(dtype);
  switch (op.op_) {
    case R::SUM: return dicomm::ReduceOp::kSum;
    case R::AVG: return dicomm::ReduceOp::kAvg;
    case R::PRODUCT: return dicomm::ReduceOp::kProduct;
    case R::MIN: return dicomm::ReduceOp::kMin;
    case R::MAX: return dicomm::ReduceOp::kMax;
    case R::BAND:
    case R::BOR:
    case R::BXOR:
      if (floating)
        bad_argument(name, std::string("bitwise reduce ops need an integer or bool tensor, got ") +
                               c10::toString(dtype));
      return op.op_ == R::BAND ? dicomm::ReduceOp::kBand
             : op.op_ == R::BOR ? dicomm::ReduceOp::kBor : dicomm::ReduceOp::kBxor;
    case R::PREMUL_SUM: {
      // torch 2.13 renamed it PreMulSumSupplement and kept this name as an alias; older releases have only this one.
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (!s) bad_argument(name, "PREMUL_SUM without its factor");
      if (s->tensor_factor.defined()) *tensor_factor = s->tensor_factor;
      else *factor = s->double_factor;
      return dicomm::ReduceOp::kSum;
    }
    default:
      bad_argument(name, "unsupported reduce op " + std::to_string(static_cast<int>(op.op_)));
  }
}

// Complex tensors reduce as pairs of reals for the ops where that is exact (sum, average).
at::Tensor reducible(const at::Tensor& t, dicomm::ReduceOp op, const char* name) {
  if (!t.is_complex()) return t;
  if (op != dicomm::ReduceOp::kSum && op != dicomm::ReduceOp::kAvg)
    bad_argument(name, "complex tensors support only sum and average");
  return at::view_as_real(t);
}

const at::Tensor& one(const std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1)
    bad_argument(op, "expected exactly one tensor, got " + std::to_string(tensors.size()));
  return tensors[0];
}

void check_dense(const at::Tensor& t, const char* op) {
  // A meta tensor has a shape but no memory: there is nothing to send, and nothing to receive into.
  if (t.is_meta())
    bad_argument(op, "the tensor is on device meta, which holds no data; expected a tensor on cpu or an accelerator");
  if (t.layout() != at::kStrided)
    bad_argument(op, std::string("expected a dense (strided) tensor, got layout ") +
                         c10::toString(t.layout()));
}

void same_shape(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* role) {
  if (t.scalar_type() != ref.scalar_type() || t.numel() != ref.numel())
    bad_argument(op, std::string(role) + " has " + std::to_string(t.numel()) + " x " +
                         c10::toString(t.scalar_type()) + ", expected " +
                         std::to_string(ref.numel()) + " x " + c10::toString(ref.scalar_type()) +
                         " like the input");
}

// Coalesced operations pair the i-th output with the i-th input.
void one_output_per_input(const std::vector<at::Tensor>& outputs,
                          const std::vector<at::Tensor>& inputs, const char* op) {
  if (outputs.size() != inputs.size())
    bad_argument(op, "got " + std::to_string(outputs.size()) + " outputs for " +
                         std::to_string(inputs.size()) + " inputs");
}

void* ptr(const at::Tensor& t) { return t.data_ptr(); }
uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

// Stagers of one operation: the work finishes them all once the engine is done.
struct Staging {
  std::vector<std::shared_ptr<Stager>> stagers;
  Stager& add() {
    stagers.push_back(std::make_shared<Stager>());
    return *stagers.back();
  }
  void attach(DicommWork& w) const {
    std::vector<std::shared_ptr<Stager>> pending;
    for (auto& s : stagers)
      if (s->needs_finish()) pending.push_back(s);
    for (auto& s : stagers)
      if (s->stream()) w.stream = s->stream();
    if (!pending.empty())
      w.finish = [pending] {
        for (auto& s : pending) s->finish();
      };
  }
};

// The buffers of an issued operation, and its staging, handed to its work.
WorkPtr with_buffers(c10::intrusive_ptr<DicommWork> w, std::vector<at::Tensor> keep, const Staging& st) {
  w->keep = std::move(keep);
  st.attach(*w);
  return w;
}

struct Gathered {
  RequestPtr request;
  std::vector<at::Tensor> keep;
};

// The coalesced variants: one engine collective per tensor, one work for them all.
struct Issued {
  std::vector<RequestPtr> requests;
  std::vector<at::Tensor> keep;
};

template <typename F>
Issued each(size_t n, F&& issue_one) {
  Issued all;
  for (size_t i = 0; i < n; ++i) {
    Gathered g = issue_one(i);
    all.requests.push_back(std::move(g.request));
    all.keep.insert(all.keep.end(), g.keep.begin(), g.keep.end());
  }
  return all;
}

}  // namespace

DicommBackend::DicommBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::chrono::milliseconds timeout, Settings settings)
    : c10d::Backend(rank, size), timeout_(timeout), settings_(std::move(settings)) {
  dicomm::Options options;
  options.timeout = timeout;
  options.settings = settings_;
  auto adapter = std::make_shared<StoreAdapter>(store);
  comm_ = translated([&] { return std::make_shared<Communicator>(adapter, rank, size, options); });
}

dicomm::LiveSet<c10::weak_intrusive_ptr<DicommBackend>>& open_backends() {
  static auto* open = new dicomm::LiveSet<c10::weak_intrusive_ptr<DicommBackend>>();  // never destroyed: read at exit
  return *open;
}

c10::intrusive_ptr<DicommBackend> DicommBackend::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, std::chrono::milliseconds timeout,
                                                        Settings settings) {
  auto b = c10::make_intrusive<DicommBackend>(store, rank, size, timeout, std::move(settings));
  open_backends().add(b);
  return b;
}

DicommBackend::~DicommBackend() { DicommBackend::release_resources(); }

void DicommBackend::release_resources() {
  if (!comm_) return;
  try {
    comm_->close();
  } catch (...) {  // nothing to report to at destruction
  }
  comm_.reset();
}

void DicommBackend::abort() { comm_->abort("process group aborted"); }
void DicommBackend::shutdown() { comm_->close(); }

// ------------------------------------------------------------------------------ splitting

// A fresh object per call: torch writes the child's name and timeout into what it gets here.
c10::intrusive_ptr<c10d::Backend::Options> DicommBackend::getBackendOptions() {
  auto o = c10::make_intrusive<DicommOptions>(timeout_, settings_);
  o->group_name = getGroupUid();
  o->group_desc = getGroupDesc();
  return o;
}

// Like gloo's: the new group's rank is this rank's position in `ranks` (group ranks of this
// group), and ranks not listed get no backend.
c10::intrusive_ptr<c10d::Backend> DicommBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const std::vector<int>& ranks,
                                                       const c10::intrusive_ptr<Options>& opts) {
  for (int r : ranks)
    if (r < 0 || r >= size_)
      bad_argument("split_group", "rank " + std::to_string(r) + " is not in the parent group (ranks 0.." +
                                      std::to_string(size_ - 1) + ")");
  auto mine = std::find(ranks.begin(), ranks.end(), rank_);
  if (mine == ranks.end()) return nullptr;
  const Settings settings = child_settings(opts);
  std::ostringstream key;
  key << "split " << (opts ? opts->group_name : std::string()) << " of";
  for (int r : ranks) key << ' ' << r;
  auto child = child_for(key.str(), [&] {
    return create(store->clone(), static_cast<int>(mine - ranks.begin()), static_cast<int>(ranks.size()),
                  opts ? opts->timeout : timeout_, settings);
  });
  // The same name and ranks while the first child lives means the same store keys: a second
  // communicator cannot come up there, and handing back the first would drop these settings.
  const auto* same = dynamic_cast<const DicommBackend*>(child.get());
  if (same && same->settings() != settings)
    bad_argument("split_group", "a split of ranks" + key.str().substr(key.str().rfind(" of") + 3) +
                                    " named '" + (opts ? opts->group_name : std::string()) +
                                    "' already exists with other settings; give this one its own group_name");
  return child;
}

DicommBackend::Settings DicommBackend::child_settings(const c10::intrusive_ptr<Options>& opts) const {
  if (const auto* own = dynamic_cast<const DicommOptions*>(opts.get())) return own->settings;
  return settings_;
}

c10::intrusive_ptr<c10d::Backend> DicommBackend::child_for(
    const std::string& key, const std::function<c10::intrusive_ptr<DicommBackend>()>& make) {
  std::lock_guard<std::mutex> lock(child_mu_);
  if (child_ && key == child_key_)
    if (auto same = child_->lock()) return same;
  c10::intrusive_ptr<c10d::Backend> child = make();
  child_key_ = key;
  child_.emplace(child);
  return child;
}

// The merged group's ranks come from the store (torch numbers them in arrival order).
c10::intrusive_ptr<c10d::Backend> DicommBackend::merge(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const c10::intrusive_ptr<Options>& opts, const int& rank,
                                                       const int& size) {
  if (rank < 0 || rank >= size)
    bad_argument("merge_remote_group", "rank " + std::to_string(rank) + " outside 0.." + std::to_string(size - 1));
  const std::string key = "merge " + (opts ? opts->group_name : std::string()) + " as " + std::to_string(rank) +
                          " of " + std::to_string(size);
  return child_for(key, [&] {
    return create(store->clone(), rank, size, opts ? opts->timeout : timeout_, child_settings(opts));
  });
}

// ------------------------------------------------------------------------------ coalescing

void DicommBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  // An exception inside torch's _coalescing_manager skips endCoalescing: a new batch replaces the
  // stale one (its operations complete on their own) instead of collecting works forever.
  if (coalescing_)
    LOG(WARNING) << "dicomm: startCoalescing before the previous batch of " << coalesced_.size()
                 << " operations was ended; that batch is left to complete on its own";
  coalesced_.clear();
  coalescing_ = true;
}

WorkPtr DicommBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<DicommWork>> batch;
  {
    std::lock_guard<std::mutex> lock(coalescing_mu_);
    if (!coalescing_) bad_argument("endCoalescing", "called without startCoalescing");
    coalescing_ = false;
    batch.swap(coalesced_);
  }
  return DicommWork::all_of(rank_, std::move(batch), timeout_);
}

std::chrono::milliseconds DicommBackend::timeout_for(std::chrono::milliseconds op_timeout) const {
  return op_timeout.count() > 0 ? op_timeout : timeout_;
}

c10::intrusive_ptr<DicommWork> DicommBackend::make_work(OpType op, std::vector<RequestPtr> requests,
                                                        std::vector<at::Tensor> result,
                                                        std::chrono::milliseconds op_timeout) {
  if (op != OpType::SEND && op != OpType::RECV && op != OpType::RECVANYSOURCE) ++collective_seq_;
  auto w = c10::make_intrusive<DicommWork>(rank_, op, std::move(requests), std::move(result),
                                           timeout_for(op_timeout));
  if (coalescing_) {
    std::lock_guard<std::mutex> lock(coalescing_mu_);
    if (coalescing_) coalesced_.push_back(w);
  }
  return w;
}

void DicommBackend::check_root(int64_t root, const char* op) const {
  if (root < 0 || root >= size_)
    bad_argument(op, "invalid root rank " + std::to_string(root) + "; the group has ranks 0.." +
                         std::to_string(size_ - 1));
}

void DicommBackend::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_)
    bad_argument(op, "invalid peer rank " + std::to_string(peer) + "; the group has ranks 0.." +
                         std::to_string(size_ - 1));
}

// ------------------------------------------------------------------------------ point-to-point

WorkPtr DicommBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  sweep_orphans();
  const at::Tensor& t = one(tensors, "send");
  check_peer(dst, "send");
  if (tag < 0) bad_argument("send", "tag " + std::to_string(tag) + " is negative");
  check_dense(t, "send");
  Staging st;
  at::Tensor host = st.add().input(t);
  st.stagers[0]->ready();
  // The engine numbers messages per (peer, tag): a late message of a receive that timed out is
  // dropped there, never handed to the next receive.
  auto req = translated([&] { return comm_->isend(ptr(host), host.nbytes(), dst, Tag(tag)); });
  auto w = make_work(OpType::SEND, {req}, tensors, c10d::kUnsetTimeout);
  w->keep = {host};
  return w;
}

WorkPtr DicommBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_peer(src, "recv");
  return post_recv(tensors, src, tag);
}

WorkPtr DicommBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return post_recv(tensors, kAnySource, tag);
}

WorkPtr DicommBackend::post_recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  sweep_orphans();
  const char* op = src == kAnySource ? "recv_anysource" : "recv";
  const at::Tensor& t = one(tensors, op);
  if (tag < 0) bad_argument(op, "tag " + std::to_string(tag) + " is negative");
  check_dense(t, op);
  Staging st;
  at::Tensor host = st.add().output(t);
  auto req = translated([&] { return comm_->irecv(ptr(host), host.nbytes(), src, Tag(tag)); });
  auto w = make_work(src == kAnySource ? OpType::RECVANYSOURCE : OpType::RECV, {req}, tensors,
                     c10d::kUnsetTimeout);
  w->keep = {host};
  w->expect_nbytes = static_cast<int64_t>(host.nbytes());
  st.attach(*w);
  return w;
}

// ------------------------------------------------------------------------------ collectives

WorkPtr DicommBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  sweep_orphans();
  const at::Tensor& t = one(tensors, "broadcast");
  check_dense(t, "broadcast");
  check_root(opts.rootRank, "broadcast");
  Staging st;
  Stager& s = st.add();
  at::Tensor buf = opts.rootRank == rank_ ? s.input(t) : s.output(t);
  s.ready();
  auto req = translated([&] { return dicomm::broadcast(*comm_, ptr(buf), buf.nbytes(), opts.rootRank); });
  return with_buffers(make_work(OpType::BROADCAST, {req}, tensors, opts.timeout), {buf}, st);
}

namespace {

// In place: the staged buffer of t, pre-multiplied for PREMUL_SUM; returns the engine request.
RequestPtr reduce_one(Communicator& comm, const at::Tensor& t, const c10d::ReduceOp& rop,
                      const char* name, int root, Stager& s, std::vector<at::Tensor>* keep) {
  check_dense(t, name);
  double factor;
  at::Tensor tensor_factor;
  dicomm::ReduceOp op = engine_op(rop, t.scalar_type(), name, &factor, &tensor_factor);
  at::Tensor buf = s.output(t, /*inout=*/true);
  s.ready();
  if (tensor_factor.defined()) buf.mul_(tensor_factor.to(at::kCPU));
  else if (factor != 1.0) buf.mul_(factor);
  at::Tensor flat = reducible(buf, op, name);
  DataType dtype = engine_dtype(flat.scalar_type(), name);
  keep->push_back(buf);
  return translated([&] {
    return root < 0 ? dicomm::all_reduce(comm, ptr(flat), flat.numel(), dtype, op)
                    : dicomm::reduce(comm, ptr(flat), flat.numel(), dtype, op, root);
  });
}

}  // namespace

WorkPtr DicommBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  sweep_orphans();
  const at::Tensor& t = one(tensors, "all_reduce");
  if (t.is_sparse()) return allreduce_sparse(tensors, opts);
  Staging st;
  std::vector<at::Tensor> keep;
  auto req = reduce_one(*comm_, t, opts.reduceOp, "all_reduce", -1, st.add(), &keep);
  return with_buffers(make_work(OpType::ALLREDUCE, {req}, tensors, opts.timeout), std::move(keep), st);
}

WorkPtr DicommBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceCoalescedOptions& opts) {
  sweep_orphans();
  Staging st;
  std::vector<at::Tensor> keep;
  std::vector<RequestPtr> reqs;
  for (auto& t : tensors)
    reqs.push_back(reduce_one(*comm_, t, opts.reduceOp, "all_reduce_coalesced", -1, st.add(), &keep));
  return with_buffers(make_work(OpType::ALLREDUCE_COALESCED, std::move(reqs), tensors, opts.timeout), std::move(keep), st);
}

WorkPtr DicommBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  sweep_orphans();
  const at::Tensor& t = one(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  Staging st;
  std::vector<at::Tensor> keep;
  auto req = reduce_one(*comm_, t, opts.reduceOp, "reduce", static_cast<int>(opts.rootRank),
                        st.add(), &keep);
  return with_buffers(make_work(OpType::REDUCE, {req}, tensors, opts.timeout), std::move(keep), st);
}

// Sparse tensors: every rank's indices and values are gathered (padded to the largest count),
// then summed locally, as gloo does. Runs to completion before it returns.
WorkPtr DicommBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                        const c10d::AllreduceOptions& opts) {
  sweep_orphans();
  at::Tensor& t = const_cast<at::Tensor&>(one(tensors, "all_reduce (sparse)"));
  if (!t.is_sparse()) bad_argument("all_reduce (sparse)", "expected a sparse COO tensor");
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM)
    bad_argument("all_reduce (sparse)", "sparse tensors support only the sum");
  const auto wait = timeout_for(opts.timeout);
  at::Tensor input = t.cpu().coalesce();
  at::Tensor indices = input.indices().contiguous();
  at::Tensor values = input.values().contiguous();
  const int64_t nnz = input._nnz();
  auto gather = [&](const at::Tensor& send, at::Tensor& out) {
    std::vector<uintptr_t> ptrs;
    for (int r = 0; r < size_; ++r)
      ptrs.push_back(address(out) + static_cast<uintptr_t>(r) * send.nbytes());
    translated([&] { dicomm::all_gather(*comm_, ptr(send), send.nbytes(), ptrs)->wait(wait); });
  };
  at::Tensor count = at::full({1}, nnz, at::kLong);
  at::Tensor counts = at::empty({size_}, at::kLong);
  gather(count, counts);
  const int64_t most = counts.max().item<int64_t>();
  auto pad = [&](const at::Tensor& x, int64_t dim) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape[dim] = most;
    at::Tensor p = at::zeros(shape, x.options());
    p.narrow(dim, 0, x.size(dim)).copy_(x);
    return p;
  };
  at::Tensor my_indices = pad(indices, 1), my_values = pad(values, 0);
  std::vector<int64_t> idx_shape{size_, my_indices.size(0), most};
  std::vector<int64_t> val_shape(my_values.sizes().begin(), my_values.sizes().end());
  val_shape.insert(val_shape.begin(), size_);
  at::Tensor all_indices = at::empty(idx_shape, my_indices.options());
  at::Tensor all_values = at::empty(val_shape, my_values.options());
  gather(my_indices, all_indices);
  gather(my_values, all_values);
  std::vector<at::Tensor> idx, val;
  for (int r = 0; r < size_; ++r) {
    const int64_t n = counts[r].item<int64_t>();
    idx.push_back(all_indices[r].narrow(1, 0, n));
    val.push_back(all_values[r].narrow(0, 0, n));
  }
  at::Tensor sum = at::sparse_coo_tensor(at::cat(idx, 1), at::cat(val, 0), input.sizes(),
                                         input.options()).coalesce();
  at::Tensor result = sum.to(t.device());
  t.copy_(result);
  auto w = make_work(OpType::_ALLREDUCE_SPARSE, {}, {result}, opts.timeout);
  w->wait();
  return w;
}

namespace {

// recv[r] receives rank r's bytes of `input`; outputs are checked against the input.
Gathered gather_into_list(Communicator& comm, const std::vector<at::Tensor>& outs,
                          const at::Tensor& input, int size, const char* op, Staging& st) {
  check_dense(input, op);
  if (static_cast<int>(outs.size()) != size)
    bad_argument(op, "output list has " + std::to_string(outs.size()) +
                         " tensors, expected one per rank (" + std::to_string(size) + ")");
  for (auto& o : outs) same_shape(o, input, op, "an output tensor");
  Stager& s = st.add();
  at::Tensor send = s.input(input);
  Gathered g;
  g.keep.push_back(send);
  std::vector<uintptr_t> ptrs;
  for (auto& o : outs) {
    at::Tensor b = s.output(o);
    ptrs.push_back(address(b));
    g.keep.push_back(b);
  }
  s.ready();
  g.request = translated([&] { return dicomm::all_gather(comm, ptr(send), send.nbytes(), ptrs); });
  return g;
}

Gathered gather_into_tensor(Communicator& comm, const at::Tensor& output, const at::Tensor& input,
                            int size, const char* op, Staging& st) {
  check_dense(input, op);
  if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * size)
    bad_argument(op, "output has " + std::to_string(output.numel()) + " x " +
                         c10::toString(output.scalar_type()) + ", expected " +
                         std::to_string(input.numel() * size) + " x " +
                         c10::toString(input.scalar_type()) + " (input x group size)");
  Stager& s = st.add();
  at::Tensor send = s.input(input);
  at::Tensor buf = s.output(output);
  s.ready();
  std::vector<uintptr_t> ptrs;
  for (int r = 0; r < size; ++r) ptrs.push_back(address(buf) + static_cast<uintptr_t>(r) * send.nbytes());
  Gathered g;
  g.keep = {send, buf};
  g.request = translated([&] { return dicomm::all_gather(comm, ptr(send), send.nbytes(), ptrs); });
  return g;
}

}  // namespace

WorkPtr DicommBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                 std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  sweep_orphans();
  if (outputs.size() != 1) bad_argument("all_gather", "expected one output list");
  Staging st;
  Gathered g = gather_into_list(*comm_, outputs[0], one(inputs, "all_gather"), size_, "all_gather", st);
  return with_buffers(make_work(OpType::ALLGATHER, {g.request}, outputs[0], opts.timeout), std::move(g.keep), st);
}

WorkPtr DicommBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                       const c10d::AllgatherOptions& opts) {
  sweep_orphans();
  Staging st;
  Gathered g = gather_into_tensor(*comm_, output, input, size_, "all_gather_into_tensor", st);
  return with_buffers(make_work(OpType::_ALLGATHER_BASE, {g.request}, {output}, opts.timeout), std::move(g.keep), st);
}

// torch's layout: output_lists[rank][i] receives rank's inputs[i].
WorkPtr DicommBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) {
  sweep_orphans();
  const char* op = "all_gather_coalesced";
  if (static_cast<int>(output_lists.size()) != size_)
    bad_argument(op, "expected one output list per rank (" + std::to_string(size_) + "), got " +
                         std::to_string(output_lists.size()));
  for (auto& l : output_lists)
    if (l.size() != inputs.size())
      bad_argument(op, "each rank's output list must hold one tensor per input (" +
                           std::to_string(inputs.size()) + "), got " + std::to_string(l.size()));
  Staging st;
  Issued all = each(inputs.size(), [&](size_t i) {
    std::vector<at::Tensor> outs;
    for (int r = 0; r < size_; ++r) outs.push_back(output_lists[r][i]);
    return gather_into_list(*comm_, outs, inputs[i], size_, op, st);
  });
  std::vector<at::Tensor> result;
  for (auto& l : output_lists) result.insert(result.end(), l.begin(), l.end());
  return with_buffers(make_work(OpType::ALLGATHER_COALESCED, std::move(all.requests), result, opts.timeout),
                      std::move(all.keep), st);
}

WorkPtr DicommBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  sweep_orphans();
  const char* op = "all_gather_into_tensor_coalesced";
  one_output_per_input(outputs, inputs, op);
  Staging st;
  Issued all = each(inputs.size(), [&](size_t i) {
    return gather_into_tensor(*comm_, outputs[i], inputs[i], size_, op, st);
  });
  return with_buffers(make_work(OpType::COALESCED, std::move(all.requests), outputs, opts.timeout),
                      std::move(all.keep), st);
}

WorkPtr DicommBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  sweep_orphans();
  const char* op = "gather";
  const at::Tensor& t = one(inputs, op);
  check_dense(t, op);
  check_root(opts.rootRank, op);
  const int root = static_cast<int>(opts.rootRank);
  Staging st;
  Stager& s = st.add();
  at::Tensor send = s.input(t);
  std::vector<at::Tensor> keep{send}, result;
  std::vector<uintptr_t> ptrs;
  if (rank_ == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      bad_argument(op, "root's output list must hold " + std::to_string(size_) + " tensors");
    for (auto& o : outputs[0]) {
      same_shape(o, t, op, "an output tensor");
      at::Tensor b = s.output(o);
      ptrs.push_back(address(b));
      keep.push_back(b);
    }
    result = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    bad_argument(op, "only the root rank passes output tensors");
  }
  s.ready();
  auto req = translated([&] { return dicomm::gather(*comm_, ptr(send), send.nbytes(), ptrs, root); });
  return with_buffers(make_work(OpType::GATHER, {req}, result, opts.timeout), std::move(keep), st);
}

WorkPtr DicommBackend::scatter(std::vector<at::Tensor>& outputs,
                               std::vector<std::vector<at::Tensor>>& inputs,
                               const c10d::ScatterOptions& opts) {
  sweep_orphans();
  const char* op = "scatter";
  const at::Tensor& t = one(outputs, op);
  check_dense(t, op);
  check_root(opts.rootRank, op);
  const int root = static_cast<int>(opts.rootRank);
  Staging st;
  Stager& s = st.add();
  std::vector<at::Tensor> keep;
  std::vector<uintptr_t> ptrs;
  if (rank_ == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
      bad_argument(op, "root's input list must hold " + std::to_string(size_) + " tensors");
    for (auto& i : inputs[0]) {
      same_shape(i, t, op, "an input tensor");
      at::Tensor b = s.input(i);
      ptrs.push_back(address(b));
      keep.push_back(b);
    }
  } else if (!inputs.empty() && !inputs[0].empty()) {
    bad_argument(op, "only the root rank passes input tensors");
  }
  at::Tensor buf = s.output(t);
  keep.push_back(buf);
  s.ready();
  auto req = translated([&] { return dicomm::scatter(*comm_, ptrs, ptr(buf), buf.nbytes(), root); });
  return with_buffers(make_work(OpType::SCATTER, {req}, outputs, opts.timeout), std::move(keep), st);
}

namespace {

Gathered reduce_scatter_blocks(Communicator& comm, std::vector<at::Tensor> blocks,
                               const at::Tensor& out, const c10d::ReduceOp& rop, const char* op,
                               Stager& s) {
  double factor;
  at::Tensor tensor_factor;
  dicomm::ReduceOp eop = engine_op(rop, out.scalar_type(), op, &factor, &tensor_factor);
  Gathered g;
  std::vector<uintptr_t> ptrs;
  for (auto& b : blocks) {
    at::Tensor x = b;
    if (tensor_factor.defined()) x = x * tensor_factor.to(at::kCPU);
    else if (factor != 1.0) x = x * factor;
    x = reducible(x.contiguous(), eop, op);
    ptrs.push_back(address(x));
    g.keep.push_back(x);
  }
  at::Tensor buf = s.output(out);
  s.ready();
  at::Tensor flat = reducible(buf, eop, op);
  g.keep.push_back(buf);
  DataType dtype = engine_dtype(flat.scalar_type(), op);
  g.request = translated([&] {
    return dicomm::reduce_scatter(comm, ptrs, ptr(flat), flat.numel(), dtype, eop);
  });
  return g;
}

Gathered reduce_scatter_flat(Communicator& comm, const at::Tensor& out, const at::Tensor& in,
                             const c10d::ReduceOp& rop, int size, const char* op, Staging& st) {
  check_dense(in, op);
  if (in.scalar_type() != out.scalar_type() || in.numel() != out.numel() * size)
    bad_argument(op, "input has " + std::to_string(in.numel()) + " x " + c10::toString(in.scalar_type()) +
                         ", expected " + std::to_string(out.numel() * size) + " x " +
                         c10::toString(out.scalar_type()) + " (output x group size)");
  Stager& s = st.add();
  at::Tensor flat_in = s.input(in).reshape({-1});
  std::vector<at::Tensor> blocks;
  for (int r = 0; r < size; ++r) blocks.push_back(flat_in.narrow(0, r * out.numel(), out.numel()));
  return reduce_scatter_blocks(comm, blocks, out, rop, op, s);
}

}  // namespace

WorkPtr DicommBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                      std::vector<std::vector<at::Tensor>>& inputs,
                                      const c10d::ReduceScatterOptions& opts) {
  sweep_orphans();
  const char* op = "reduce_scatter";
  const at::Tensor& out = one(outputs, op);
  check_dense(out, op);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
    bad_argument(op, "input list must hold one tensor per rank (" + std::to_string(size_) + ")");
  Staging st;
  Stager& s = st.add();
  std::vector<at::Tensor> blocks;
  for (auto& i : inputs[0]) {
    same_shape(i, out, op, "an input tensor");
    blocks.push_back(s.input(i));
  }
  Gathered g = reduce_scatter_blocks(*comm_, blocks, out, opts.reduceOp, op, s);
  return with_buffers(make_work(OpType::REDUCE_SCATTER, {g.request}, outputs, opts.timeout), std::move(g.keep), st);
}

WorkPtr DicommBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                            const c10d::ReduceScatterOptions& opts) {
  sweep_orphans();
  Staging st;
  Gathered g = reduce_scatter_flat(*comm_, output, input, opts.reduceOp, size_, "reduce_scatter_tensor", st);
  return with_buffers(make_work(OpType::_REDUCE_SCATTER_BASE, {g.request}, {output}, opts.timeout), std::move(g.keep), st);
}

WorkPtr DicommBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::ReduceScatterOptions& opts) {
  sweep_orphans();
  const char* op = "reduce_scatter_tensor_coalesced";
  one_output_per_input(outputs, inputs, op);
  Staging st;
  Issued all = each(inputs.size(), [&](size_t i) {
    return reduce_scatter_flat(*comm_, outputs[i], inputs[i], opts.reduceOp, size_, op, st);
  });
  return with_buffers(
      make_work(reduce_scatter_coalesced_type<OpType>(0), std::move(all.requests), outputs, opts.timeout),
      std::move(all.keep), st);
}

namespace {

// Byte sizes of each rank's slice of t along dim 0.
std::vector<size_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                const char* role) {
  const int64_t rows = t.dim() ? t.size(0) : 1;
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    if (rows % size)
      bad_argument("all_to_all_single", std::string(role) + " has " + std::to_string(rows) +
                                            " rows, not divisible by the group size " +
                                            std::to_string(size) + "; pass split sizes");
    s.assign(size, rows / size);
  }
  int64_t sum = 0;
  for (int64_t x : s) {
    if (x < 0) sum = -1 << 30;
    sum += x;
  }
  if (static_cast<int>(s.size()) != size || sum != rows)
    bad_argument("all_to_all_single", std::string(role) + " split sizes must be " +
                                          std::to_string(size) + " non-negative numbers summing to " +
                                          std::to_string(rows));
  const size_t row_bytes = rows ? t.nbytes() / rows : 0;
  std::vector<size_t> out;
  for (int64_t x : s) out.push_back(static_cast<size_t>(x) * row_bytes);
  return out;
}

std::vector<uintptr_t> offsets(const at::Tensor& base, const std::vector<size_t>& sizes) {
  std::vector<uintptr_t> out;
  uintptr_t at = address(base);
  for (size_t s : sizes) {
    out.push_back(at);
    at += s;
  }
  return out;
}

}  // namespace

WorkPtr DicommBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                     std::vector<int64_t>& output_splits,
                                     std::vector<int64_t>& input_splits,
                                     const c10d::AllToAllOptions& opts) {
  sweep_orphans();
  const char* op = "all_to_all_single";
  check_dense(input, op);
  if (output.scalar_type() != input.scalar_type())
    bad_argument(op, "output dtype differs from input dtype");
  auto send_bytes = split_bytes(input, input_splits, size_, "input");
  auto recv_bytes = split_bytes(output, output_splits, size_, "output");
  Staging st;
  Stager& s = st.add();
  at::Tensor send = s.input(input);
  at::Tensor buf = s.output(output);
  s.ready();
  auto req = translated([&] {
    return dicomm::all_to_all(*comm_, offsets(send, send_bytes), send_bytes, offsets(buf, recv_bytes), recv_bytes);
  });
  return with_buffers(make_work(OpType::ALLTOALL_BASE, {req}, {output}, opts.timeout), {send, buf}, st);
}

WorkPtr DicommBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                const c10d::AllToAllOptions& opts) {
  sweep_orphans();
  const char* op = "all_to_all";
  if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_)
    bad_argument(op, "expected " + std::to_string(size_) + " input and output tensors, got " +
                         std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  Staging st;
  Stager& s = st.add();
  std::vector<uintptr_t> sp, rp;
  std::vector<size_t> sb, rb;
  std::vector<at::Tensor> keep;
  for (auto& t : inputs) {
    check_dense(t, op);
    at::Tensor b = s.input(t);
    sp.push_back(address(b));
    sb.push_back(b.nbytes());
    keep.push_back(b);
  }
  for (auto& t : outputs) {
    at::Tensor b = s.output(t);
    rp.push_back(address(b));
    rb.push_back(b.nbytes());
    keep.push_back(b);
  }
  s.ready();
  auto req = translated([&] { return dicomm::all_to_all(*comm_, sp, sb, rp, rb); });
  return with_buffers(make_work(OpType::ALLTOALL, {req}, outputs, opts.timeout), std::move(keep), st);
}

WorkPtr DicommBackend::barrier(const c10d::BarrierOptions& opts) {
  sweep_orphans();
  auto req = translated([&] { return dicomm::barrier(*comm_); });
  return make_work(OpType::BARRIER, {req}, {}, opts.timeout);
}

// Like gloo's: every rank reports to rank 0, which names the ranks that did not arrive in time,
// then releases them all.
// A timeout of 0 is a real one (gloo's contract: only kUnsetTimeout means the group's timeout).
void DicommBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  const Tag arrive = kMonitoredBarrierTag + 2 * monitored_barriers_;
  const Tag release = arrive + 1;
  ++monitored_barriers_;
  // The bytes carry nothing: static, so a request withdrawn at a timeout never outlives them.
  static const uint8_t token = 1;
  static uint8_t sink;
  if (rank_ != 0) {
    translated([&] { comm_->isend(&token, 1, 0, arrive)->wait(left()); });
    try {
      translated([&] { comm_->irecv(&sink, 1, 0, release)->wait(left()); });
    } catch (const BackendError& e) {
      fail(e.kind, "Rank " + std::to_string(rank_) +
                         " successfully reached monitoredBarrier, but received errors while waiting for send/recv "
                         "from rank 0 (" + e.what_without_backtrace() + ")");
    }
    return;
  }
  std::vector<RequestPtr> arrivals(size_);
  for (int r = 1; r < size_; ++r) arrivals[r] = translated([&] { return comm_->irecv(&sink, 1, r, arrive); });
  std::vector<int> missing;
  std::string first_error;
  for (int r = 1; r < size_; ++r) {
    // Like gloo: out of time before asking the next rank is rank 0's own timeout, not that rank's.
    if (!wait_all_ranks && left().count() == 0) {
      std::ostringstream text;
      text << "Rank 0 timed out in monitoredBarrier after " << timeout.count() << " ms; ranks " << r << ".."
           << size_ - 1 << " not checked";
      fail(Kind::kTimeout, text.str());
    }
    try {
      arrivals[r]->wait(left());
    } catch (const std::exception& e) {
      missing.push_back(r);
      if (first_error.empty()) first_error = e.what();
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    std::ostringstream text;
    text << (missing.size() == 1 ? "Rank " : "Ranks ");
    for (size_t i = 0; i < missing.size(); ++i) text << (i ? ", " : "") << missing[i];
    text << " failed to pass monitoredBarrier in " << timeout.count() << " ms (" << first_error << ")";
    fail(Kind::kTimeout, text.str());
  }
  translated([&] {
    std::vector<RequestPtr> sends;
    for (int r = 1; r < size_; ++r) sends.push_back(comm_->isend(&token, 1, r, release));
    for (auto& s : sends) s->wait(left());
  });
}

}  // namespace dicomm::torch_backend
