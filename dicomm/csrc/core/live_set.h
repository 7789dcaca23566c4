// Objects still open at interpreter exit, held weakly so the set keeps none alive: an atexit
// hook takes the survivors and closes them, so no engine thread outlives Python.
#pragma once

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace dicomm {

// Weak: a weak pointer type with lock() (std::weak_ptr, c10::weak_intrusive_ptr).
template <typename Weak>
class LiveSet {
 public:
  using Strong = decltype(std::declval<Weak&>().lock());

  void add(const Strong& object) {
    std::lock_guard<std::mutex> lock(mu_);
    // Dropped the gone ones first: the set stays as large as what is open, however many come and go.
    items_.erase(std::remove_if(items_.begin(), items_.end(), [](const Weak& w) { return w.expired(); }), items_.end());
    items_.emplace_back(object);
  }

  // The objects still alive; the set is left empty. Close them outside any lock.
  std::vector<Strong> take() {
    std::vector<Strong> live;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : items_)
      if (auto s = w.lock()) live.push_back(s);
    items_.clear();
    return live;
  }

 private:
  std::mutex mu_;
  std::vector<Weak> items_;
};

}  // namespace dicomm
