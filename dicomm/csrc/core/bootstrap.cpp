#include "core/bootstrap.h"

#include <cstdlib>

#include "core/types.h"

namespace dicomm {
namespace {
bool is_count(const std::string& s) {
  return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

std::string launcher_attempt() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (!v || !*v) return "0";
  const std::string s(v);
  if (!is_count(s))
    throw ValueError("TORCHELASTIC_RESTART_COUNT='" + s + "' is not a restart count (expected a non-negative integer)");
  return std::to_string(std::stoi(s));
}

// torch's own test (torch.distributed.rendezvous): the workers use the elastic agent's store, which
// outlives the restart round. Otherwise each round (or a plain launch) has a fresh store.
bool on_agent_store() {
  const char* v = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return v && std::string(v) == "True";
}

std::string entry_key(int rank) { return "dicomm/entered/" + std::to_string(rank); }
}  // namespace

void Bootstrap::enter_round() {
  // The nodes of one round may disagree on the restart count (an agent whose worker failed counts a
  // restart, one restarted for the membership change does not): only a store that outlives the round
  // needs the count in the keys, and only there is it read.
  agent_store_ = on_agent_store();
  attempt_ = agent_store_ ? launcher_attempt() : "0";
  // On the agent's store a round is also told by its size (bootstrap.h: the count stays put when
  // the world changes); elsewhere the key names are as they always were.
  const std::string round = agent_store_ ? attempt_ + ".w" + std::to_string(size_) : attempt_;
  const int64_t n = store_->add("dicomm/round/" + round + "/" + std::to_string(rank_), 1);
  scope_ = !agent_store_ && n == 1 ? "dicomm/" : "dicomm/" + round + "." + std::to_string(n - 1) + "/";
  if (agent_store_) store_->set(entry_key(rank_), attempt_);  // what a peer that waits in vain reads
}

std::string Bootstrap::other_count(Store& store, int peer) const {
  if (!agent_store_) return "";
  std::string theirs;
  try {
    if (!store.check(entry_key(peer))) return "";
    theirs = store.get(entry_key(peer), std::chrono::milliseconds(1000));
  } catch (const Error&) {
    return "";  // no better word than the timeout itself
  }
  if (!is_count(theirs)) return "";  // another program's key
  const int their_count = std::stoi(theirs), our_count = std::stoi(attempt_);
  if (their_count == our_count) return "";
  theirs = std::to_string(their_count);
  const std::string who = "rank " + std::to_string(peer);
  const std::string remedy =
      "their agents count restarts differently: on torch's shared agent store (TORCHELASTIC_USE_AGENT_STORE=True) "
      "each restart count has its own keys, so such ranks never meet; set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on "
      "every agent of a c10d rendezvous (a fresh store every round)";
  // A lower count may be an earlier round's entry, the peer not (yet) in this one.
  if (their_count < our_count)
    return "; " + who + " last entered this store at restart count " + theirs + " and this rank is at restart count " +
           attempt_ + " (TORCHELASTIC_RESTART_COUNT): either " + who + " has not reached this round, or " + remedy;
  return "; " + who + " entered this store at restart count " + theirs + " and this rank at restart count " + attempt_ +
         " (TORCHELASTIC_RESTART_COUNT): " + remedy;
}

Bootstrap::Bootstrap(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

Token Bootstrap::agree_on_token() {
  if (rank_ == 0) {
    Token t = random_token();
    store_->set(scope_ + "token", token_hex(t));
    return t;
  }
  try {
    return token_from_hex(store_->get(scope_ + "token", timeout_));
  } catch (const TimeoutError& e) {
    const std::string why = other_count(*store_, 0);
    throw TimeoutError(std::string("rank ") + std::to_string(rank_) + " waited for rank 0 to publish the job token: " +
                       e.what() + (why.empty() ? " (did rank 0 start?)" : why));
  }
}

// The signature covers the round and the rank as well as the card: a card signed for one rank or
// round cannot be replayed as another's.
std::string card_mac_hex(const std::string& key, const std::string& scope, int rank, const std::string& body) {
  const std::string msg = "dicomm card\n" + scope + "\n" + std::to_string(rank) + "\n" + body;
  const Digest d = hmac_sha256(key, msg.data(), msg.size());
  return hex_of(d.data(), d.size());
}

std::string verified_card_text(const std::string& text, const std::string& key, const std::string& scope, int rank) {
  // The signature is the last line; the card is everything before it, byte for byte.
  const std::string tag = "mac=";
  const size_t at = text.size() >= 2 ? text.rfind("\n" + tag, text.size() - 2) : std::string::npos;
  std::string body = at == std::string::npos ? "" : text.substr(0, at + 1);
  std::string mac = at == std::string::npos ? "" : text.substr(at + 1 + tag.size());
  if (!mac.empty() && mac.back() == '\n') mac.pop_back();
  const std::string want = card_mac_hex(key, scope, rank, body);
  if (mac.size() == want.size() &&
      digests_equal(reinterpret_cast<const uint8_t*>(mac.data()), reinterpret_cast<const uint8_t*>(want.data()),
                    want.size()))
    return body;
  throw PeerError("the address card of rank " + std::to_string(rank) + " in the store is " +
                  (mac.empty() ? "not signed" : "signed with another key") +
                  ", but this job has a DICOMM_JOB_SECRET: it was forged or replaced by someone who can write "
                  "the store (or rank " + std::to_string(rank) + " runs with a different secret); refused");
}

void Bootstrap::publish(const Card& card) {
  std::string text = card.encode();
  if (!card_key_.empty()) text += "mac=" + card_mac_hex(card_key_, scope_, rank_, text) + "\n";
  store_->set(scope_ + "card/" + std::to_string(rank_), text);
}

Card Bootstrap::fetch(int peer, const std::atomic<bool>* stop) {
  std::shared_ptr<Store> store;
  {
    // With the store read under the lock release_store takes, a fetch either starts before the
    // release (its entry is cleared with the others) or sees the communicator closed: no entry
    // outlives the release.
    std::lock_guard<std::mutex> lock(awaiting_mu_);
    store = store_;
    if (!store) throw PeerError("communicator closed");
    awaiting_.insert(peer);
  }
  std::string text;
  // In slices, so that a closing communicator's connector does not wait out the whole timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto slice = stop ? std::min(left, std::chrono::milliseconds(1000)) : left;
    try {
      text = store->get(scope_ + "card/" + std::to_string(peer), std::max(slice, std::chrono::milliseconds(1)));
      break;
    } catch (const TimeoutError& e) {
      if (stop && *stop) throw PeerError("communicator closed");
      if (slice < left) continue;
      const std::string why = other_count(*store, peer);
      throw TimeoutError("rank " + std::to_string(peer) + " never published its address card: " + e.what() +
                         (why.empty() ? " (did it create its communicator?)" : why));
    }
  }
  {
    std::lock_guard<std::mutex> lock(awaiting_mu_);
    awaiting_.erase(peer);
  }
  if (!card_key_.empty()) text = verified_card_text(text, card_key_, scope_, peer);
  try {
    return Card::decode(text);
  } catch (const ValueError& e) {
    throw ValueError("address card of rank " + std::to_string(peer) + ": " + e.what());
  }
}

void Bootstrap::release_store() {
  std::shared_ptr<Store> store;
  {
    std::lock_guard<std::mutex> lock(awaiting_mu_);
    store.swap(store_);
    awaiting_.clear();
  }
  // Dropped here, outside the lock: the last reference to a Python store takes the GIL, which a
  // thread waiting for the lock (a fetch called from Python) may hold.
}

std::string Bootstrap::awaited_cards() const {
  std::shared_ptr<Store> store;
  std::set<int> awaiting;
  {
    std::lock_guard<std::mutex> lock(awaiting_mu_);
    store = store_;
    awaiting = awaiting_;
  }
  std::string out;
  for (int peer : awaiting)
    out += std::string(out.empty() ? "" : "; ") + "rank " + std::to_string(peer) +
           " has not published its address card" + (store ? other_count(*store, peer) : "");
  return out;
}

}  // namespace dicomm
