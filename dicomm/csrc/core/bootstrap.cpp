#include "core/bootstrap.h"

#include <cstdlib>

#include "core/types.h"

namespace dicomm {
namespace {
std::string launcher_attempt() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (!v || !*v) return "0";
  const std::string s(v);
  if (s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    throw ValueError("TORCHELASTIC_RESTART_COUNT='" + s + "' is not a restart count (expected a non-negative integer)");
  return std::to_string(std::stoi(s));
}
}  // namespace

void Bootstrap::enter_round() {
  const std::string attempt = launcher_attempt();
  const int64_t n = store_->add("dicomm/round/" + attempt + "/" + std::to_string(rank_), 1);
  scope_ = attempt == "0" && n == 1 ? "dicomm/" : "dicomm/" + attempt + "." + std::to_string(n - 1) + "/";
}

Bootstrap::Bootstrap(std::shared_ptr<Store> store, int rank, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), timeout_(timeout) {}

Token Bootstrap::agree_on_token() {
  if (rank_ == 0) {
    Token t = random_token();
    store_->set(scope_ + "token", token_hex(t));
    return t;
  }
  try {
    return token_from_hex(store_->get(scope_ + "token", timeout_));
  } catch (const TimeoutError& e) {
    throw TimeoutError(std::string("rank ") + std::to_string(rank_) +
                       " waited for rank 0 to publish the job token: " + e.what() + " (did rank 0 start?)");
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
  std::shared_ptr<Store> store = store_;
  if (!store) throw PeerError("communicator closed");
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
      throw TimeoutError("rank " + std::to_string(peer) + " never published its address card: " + e.what() +
                         " (did it create its communicator?)");
    }
  }
  if (!card_key_.empty()) text = verified_card_text(text, card_key_, scope_, peer);
  try {
    return Card::decode(text);
  } catch (const ValueError& e) {
    throw ValueError("address card of rank " + std::to_string(peer) + ": " + e.what());
  }
}

}  // namespace dicomm
