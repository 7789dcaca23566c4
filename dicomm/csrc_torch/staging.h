// Host buffers that stand in for tensors the engine cannot address directly.
//
// The engine moves bytes between contiguous host buffers. A contiguous CPU tensor is used as it
// is; a non-contiguous one goes through a contiguous copy; a tensor on an accelerator goes through
// a pinned host buffer, ordered with the device's current stream: the copy to the host is queued
// on that stream and the stream is synchronised before the engine reads the buffer; received data
// is copied back on the same stream once the engine has filled the buffer.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <optional>
#include <utility>
#include <vector>

namespace dicomm::torch_backend {

class Stager {
 public:
  // A contiguous host tensor holding t's values (t itself when possible).
  at::Tensor input(const at::Tensor& t);
  // A contiguous host tensor the engine writes into; finish() copies it into t. With `inout`
  // the buffer also starts with t's values (in-place collectives).
  at::Tensor output(const at::Tensor& t, bool inout = false);
  // Waits for queued device-to-host copies; call before the engine touches the buffers.
  void ready();
  bool needs_finish() const { return !back_.empty(); }
  // The device stream results are ordered on (none for CPU tensors).
  std::optional<c10::Stream> stream() const { return stream_; }
  // Copies results into the caller's tensors (on the stream current when staging began).
  void finish();

 private:
  void use_stream_of(const at::Tensor& t);
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (caller's tensor, host buffer)
  std::optional<c10::Stream> stream_;
  bool pending_sync_ = false;
};

}  // namespace dicomm::torch_backend
