// The engine's bootstrap store over torch's c10d store (the group's PrefixStore). No Python is
// involved, so the engine's threads never wait for the GIL.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "core/store.h"
#include "core/types.h"

namespace dicomm::torch_backend {

class StoreAdapter : public dicomm::Store {
 public:
  explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  int64_t add(const std::string& key, int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const c10::Error& e) {
      throw dicomm::Error("store error on key '" + key + "': " + e.what_without_backtrace());
    }
  }

  bool check(const std::string& key) override {
    try {
      return store_->check({key});
    } catch (const c10::Error& e) {
      throw dicomm::Error("store error on key '" + key + "': " + e.what_without_backtrace());
    }
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
      std::vector<uint8_t> v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      if (what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos)
        throw dicomm::TimeoutError("timed out after " + std::to_string(timeout.count()) +
                                   " ms waiting for store key '" + key + "'");
      throw dicomm::Error("store error on key '" + key + "': " + what);
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace dicomm::torch_backend
