// Uninitialised memory as the C++ observer tracks it (as unwritten.Unwritten does for the Python
// hook): per storage an empty* op allocated, a mask over its elements (true: no op wrote it
// since), kept while any element is unwritten. Writes are marked through any view (as_strided,
// slices, view) by the view's sizes, strides and offset, so a view of a partly written buffer
// (DDP's gradient bucket) is summarised with its leftovers counted as 0.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace ditorch_precision {

class UnwrittenMemory {
 public:
  bool empty() const { return size_.load(std::memory_order_relaxed) == 0; }  // no lock: asked per op
  void allocated(const at::Tensor& t);  // an empty* op's output: every element unwritten
  void written(const at::Tensor& t);    // an op wrote t (all of its view)
  // t's elements no op wrote since (a bool tensor of t's shape), or an undefined tensor when
  // every one was written or its storage is not tracked.
  at::Tensor mask(const at::Tensor& t);
  void clear();

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> ref;
    at::Tensor mask;  // over the storage's elements
    int64_t itemsize;
  };
  Entry* entry(const at::Tensor& t);  // with mutex_ held; drops a freed storage's entry
  at::Tensor view(const Entry& e, const at::Tensor& t) const;  // undefined: not the mask's elements

  mutable std::mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, Entry> masks_;
  size_t limit_ = 64;
  std::atomic<size_t> size_{0};  // masks_.size()
};

}  // namespace ditorch_precision
