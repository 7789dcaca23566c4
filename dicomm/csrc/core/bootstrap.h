// Bootstrap through the store: the per-job token (rank 0 draws it) and each rank's address card
// (published in the constructor, read lazily by a peer on first contact).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "core/card.h"
#include "core/handshake.h"
#include "core/store.h"

namespace dicomm {

class Bootstrap {
 public:
  Bootstrap(std::shared_ptr<Store> store, int rank, std::chrono::milliseconds timeout);
  // Rank 0 draws and publishes the token; the others wait for it.
  Token agree_on_token();
  void publish(const Card& card);
  // Throws TimeoutError / ValueError naming the peer; gives up (PeerError) once `*stop` is set.
  Card fetch(int peer, const std::atomic<bool>* stop = nullptr);
  void release_store() { store_.reset(); }

 private:
  std::shared_ptr<Store> store_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dicomm
