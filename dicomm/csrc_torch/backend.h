// The torch.distributed backend "dicomm": a c10d::Backend over one dicomm engine communicator.
//
// torch registers it for its devices like gloo's, so a ProcessGroup holds one backend per device
// ("cpu:gloo,cuda:dicomm" keeps gloo for CPU tensors) and every path built on
// pg._get_backend(device) works. Tensors off the CPU or not contiguous go through host staging.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/communicator.h"
#include "core/live_set.h"

namespace dicomm::torch_backend {

class DicommWork;

class DicommBackend : public c10d::Backend {
 public:
  // Knobs of docs/dicomm-config.md by variable name, for one group's communicator.
  using Settings = std::map<std::string, std::string>;

  // Its own type so that Python can copy it (dist.split_group deep-copies the parent's options)
  // and so that a group's settings travel with it: pg_options of init_process_group / new_group,
  // and what a split or merge child inherits.
  struct DicommOptions : Options {
    explicit DicommOptions(std::chrono::milliseconds timeout, Settings settings = {})
        : Options("dicomm", timeout), settings(std::move(settings)) {}
    Settings settings;
  };

  // A backend counted among open_backends() (what torch's creator, split and merge hand out).
  static c10::intrusive_ptr<DicommBackend> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  Settings settings = {});
  DicommBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                std::chrono::milliseconds timeout, Settings settings = {});
  ~DicommBackend() override;
  // The last strong reference is gone. A weak one (open_backends(), torch's) defers the destructor
  // until it goes too: the communicator (threads, descriptors, shared segments) is closed and
  // freed here, not then.
  void release_resources() override;

  const std::string getBackendName() const override { return "dicomm"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const Settings& settings() const { return settings_; }
  dicomm::Communicator& communicator() { return *comm_; }

  // Splitting (ProcessGroup::splitGroup, dist.split_group) and merging: the members of the new
  // group bootstrap a communicator of their own through the store torch hands over; ranks left
  // out take no part (like gloo's, unlike NCCL's ncclCommSplit, which all parent ranks call).
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts, const int& rank,
                                          const int& size) override;

  // Coalescing (NCCL's contract): between startCoalescing and endCoalescing every operation is
  // issued at once as usual and returns its own work; endCoalescing returns one work that
  // completes when all of them have (batch_isend_irecv, _coalescing_manager(device=...)).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return collective_seq_; }
  void abort() override;
  void shutdown() override;

 private:
  c10::intrusive_ptr<DicommWork> make_work(c10d::OpType op, std::vector<RequestPtr> requests,
                                           std::vector<at::Tensor> result,
                                           std::chrono::milliseconds op_timeout);
  std::chrono::milliseconds timeout_for(std::chrono::milliseconds op_timeout) const;
  void check_root(int64_t root, const char* op) const;
  void check_peer(int peer, const char* op) const;
  c10::intrusive_ptr<c10d::Work> post_recv(std::vector<at::Tensor>& tensors, int src, int tag);

  std::shared_ptr<dicomm::Communicator> comm_;
  std::chrono::milliseconds timeout_;
  Settings settings_;  // as given (the environment overrides them inside the engine)
  // A child's settings: those of `opts` when they are dicomm's, else this group's.
  Settings child_settings(const c10::intrusive_ptr<Options>& opts) const;
  // torch 2.13 splits (and merges) once per device type this backend serves (cpu and cuda): the
  // second call for the same child gets the first child, so no second communicator races it on
  // the same store keys.
  c10::intrusive_ptr<c10d::Backend> child_for(const std::string& key,
                                              const std::function<c10::intrusive_ptr<DicommBackend>()>& make);
  std::mutex child_mu_;
  std::string child_key_;
  std::optional<c10::weak_intrusive_ptr<c10d::Backend>> child_;
  std::atomic<bool> coalescing_{false};
  std::mutex coalescing_mu_;
  std::vector<c10::intrusive_ptr<DicommWork>> coalesced_;  // issued since startCoalescing
  uint64_t collective_seq_ = 0;
  uint64_t monitored_barriers_ = 0;
};

// The backends created so far, held weakly: the module's exit hook closes those still open.
dicomm::LiveSet<c10::weak_intrusive_ptr<DicommBackend>>& open_backends();

}  // namespace dicomm::torch_backend
