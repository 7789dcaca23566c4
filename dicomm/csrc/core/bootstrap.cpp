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

void Bootstrap::publish(const Card& card) { store_->set(scope_ + "card/" + std::to_string(rank_), card.encode()); }

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
  try {
    return Card::decode(text);
  } catch (const ValueError& e) {
    throw ValueError("address card of rank " + std::to_string(peer) + ": " + e.what());
  }
}

}  // namespace dicomm
