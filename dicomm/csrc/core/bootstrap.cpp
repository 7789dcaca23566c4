#include "core/bootstrap.h"

#include "core/types.h"

namespace dicomm {
namespace {
const char* kTokenKey = "dicomm/token";
std::string card_key(int rank) { return "dicomm/card/" + std::to_string(rank); }
}  // namespace

Bootstrap::Bootstrap(std::shared_ptr<Store> store, int rank, std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), timeout_(timeout) {}

Token Bootstrap::agree_on_token() {
  if (rank_ == 0) {
    Token t = random_token();
    store_->set(kTokenKey, token_hex(t));
    return t;
  }
  try {
    return token_from_hex(store_->get(kTokenKey, timeout_));
  } catch (const TimeoutError& e) {
    throw TimeoutError(std::string("rank ") + std::to_string(rank_) +
                       " waited for rank 0 to publish the job token: " + e.what() + " (did rank 0 start?)");
  }
}

void Bootstrap::publish(const Card& card) { store_->set(card_key(rank_), card.encode()); }

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
      text = store->get(card_key(peer), std::max(slice, std::chrono::milliseconds(1)));
      break;
    } catch (const TimeoutError& e) {
      if (stop && *stop) throw PeerError("communicator closed");
      if (slice < left) continue;
      throw TimeoutError("rank " + std::to_string(peer) + " never published its address card: " + e.what() +
                         " (did it create its communicator?)");
    }
  }
  try {
    return Card::decode(text);
  } catch (const ValueError& e) {
    throw ValueError("address card of rank " + std::to_string(peer) + ": " + e.what());
  }
}

}  // namespace dicomm
