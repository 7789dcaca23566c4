// Bootstrap through the store: the per-job token (rank 0 draws it) and each rank's address card
// (published in the constructor, read lazily by a peer on first contact).
//
// Keys are scoped to the round: a store may outlive the ranks that wrote into it (torchelastic
// keeps its rendezvous store across restarts; a job may re-create a group after
// destroy_process_group), and a rank must never read the token or card of a previous round's rank.
// The round is the launcher's attempt (TORCHELASTIC_RESTART_COUNT, 0 without one) and this rank's
// count of communicators it created on this store under that attempt (a counter in the store, one
// per rank, so no rank's count depends on when the others arrive): every rank of a round computes
// the same scope. The first round of attempt 0 keeps the plain keys "dicomm/token", "dicomm/card/<r>";
// later ones use "dicomm/<attempt>.<n>/token" and so on.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "core/card.h"
#include "core/handshake.h"
#include "core/store.h"

namespace dicomm {

class Bootstrap {
 public:
  Bootstrap(std::shared_ptr<Store> store, int rank, std::chrono::milliseconds timeout);
  // Joins the round (above); before anything else reads or writes a key. Throws ValueError on a
  // malformed TORCHELASTIC_RESTART_COUNT.
  void enter_round();
  const std::string& scope() const { return scope_; }  // "dicomm/" or "dicomm/<attempt>.<n>/"
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
  std::string scope_ = "dicomm/";
};

}  // namespace dicomm
