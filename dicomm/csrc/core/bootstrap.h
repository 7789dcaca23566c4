// Bootstrap through the store: the per-job token (rank 0 draws it) and each rank's address card
// (published in the constructor, read lazily by a peer on first contact).
//
// Keys are scoped to the round: a store may outlive the ranks that wrote into it (torchelastic's
// agent store, kept across restarts; a job may re-create a group after destroy_process_group), and
// a rank must never read the token or card of a previous round's rank. The round is the launcher's
// attempt and this rank's count of communicators it created on this store under that attempt (a
// counter in the store, one per rank, so no rank's count depends on when the others arrive): every
// rank of a round computes the same scope. The attempt is TORCHELASTIC_RESTART_COUNT only on the
// agent's store (TORCHELASTIC_USE_AGENT_STORE=True); on a fresh store every round (a c10d rendezvous
// with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, a plain launch) it is 0: nothing there is stale, and the
// nodes of one round may disagree on the restart count. On the agent's store each rank also writes
// the count it entered under ("dicomm/entered/<r>"), so a rank that waits for a peer in vain can say
// when the peer entered under another count. On the agent's store the world size is part of the
// round too: a membership change restarts the workers without moving the restart count, and a rank
// new to the store (the world grew) would otherwise count its first communicator where the others
// count their second, and read an earlier round's keys; every rank of a round of size w is in every
// round of that size, so per (attempt, w) the per-rank counts stay equal. Elsewhere the first round
// of attempt 0 keeps the plain keys "dicomm/token", "dicomm/card/<r>"; later ones use
// "dicomm/<attempt>.<n>/token" and so on.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "core/card.h"
#include "core/handshake.h"
#include "core/store.h"

namespace dicomm {

class Bootstrap {
 public:
  Bootstrap(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout);
  // Joins the round (above); before anything else reads or writes a key. Throws ValueError on a
  // malformed TORCHELASTIC_RESTART_COUNT (read on the agent's store only).
  void enter_round();
  // "dicomm/" or "dicomm/<attempt>.<n>/"; on the agent's store "dicomm/<attempt>.w<size>.<n>/"
  const std::string& scope() const { return scope_; }
  // Rank 0 draws and publishes the token; the others wait for it.
  Token agree_on_token();
  // With DICOMM_JOB_SECRET the cards are signed: `key` is the handshake key (token + secret), and
  // a card whose signature is missing or wrong is refused (whoever can write the store can replace
  // a card, but cannot sign one without the secret). Without a secret, `key` is empty and cards are
  // unsigned: what a card claims is checked against the kernel's word on each connection instead.
  void sign_cards_with(std::string key) { card_key_ = std::move(key); }
  void publish(const Card& card);
  // Throws TimeoutError / ValueError naming the peer, PeerError for a card not signed with the
  // job's key; gives up (PeerError) once `*stop` is set.
  Card fetch(int peer, const std::atomic<bool>* stop = nullptr);
  // "" when every card fetched was found; else the ranks whose cards a fetch waits (or waited in vain)
  // for and, on the agent's store, why one may never come: what a collective that timed out while
  // connecting adds to its error. (Kept after a failed fetch: a collective's own timeout may pass
  // between one thread's fetch giving up and the next one's starting.)
  std::string awaited_cards() const;
  void release_store();

 private:
  // "" or why a wait for `peer` may never end: on the agent's store, it entered under another count.
  std::string other_count(Store& store, int peer) const;

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string scope_ = "dicomm/";
  bool agent_store_ = false;    // the elastic agent's store, which outlives the round
  std::string attempt_ = "0";  // the restart count the keys are scoped by: "0" unless agent_store_
  std::string card_key_;  // empty: cards are not signed
  mutable std::mutex awaiting_mu_;  // guards awaiting_, and store_ once the connector threads run
  std::set<int> awaiting_;  // peers whose cards a fetch has not found (yet)
};

// A signed card is its text followed by the line "mac=<hex>\n" (with a secret; see sign_cards_with).
std::string card_mac_hex(const std::string& key, const std::string& scope, int rank, const std::string& body);
// The card text of `rank` without its signature line; throws PeerError naming the rank when the
// signature is missing or wrong. The text is untrusted (tests/cxx/fuzz/fuzz_handshake.cpp).
std::string verified_card_text(const std::string& text, const std::string& key, const std::string& scope, int rank);

}  // namespace dicomm
