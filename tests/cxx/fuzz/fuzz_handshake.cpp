// Fuzz target: what a listener reads before it trusts anyone, and what a rank reads from the store.
// The input's bytes arrive on a real Unix socket in pieces (HelloReader, transport/socket.h) and the
// hello is then judged (check_hello, core/handshake.h); the same bytes are decoded as an address
// card (Card::decode, core/card.h), which is untrusted data from the store, and as a signed card
// (verified_card_text, core/bootstrap.h). None may read or write outside what it holds, whatever the bytes.
#include <sys/socket.h>
#include <unistd.h>

#include "core/bootstrap.h"
#include "core/card.h"
#include "fuzz_main.h"
#include "transport/socket.h"

using namespace dicomm;
using namespace dicomm::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    Card c = Card::decode(std::string(reinterpret_cast<const char*>(data), size));
    (void)c.encode();
  } catch (const ValueError&) {
  }
  try {
    (void)verified_card_text(std::string(reinterpret_cast<const char*>(data), size), "key", "dicomm/", 1);
  } catch (const PeerError&) {
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  UniqueFd writer(sv[1]);
  // A well-formed hello now and then: the input's first byte picks whether the rest patches one.
  std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string key = "0123456789abcdef" + std::string(size > 1 ? size % 7 : 0, 's');
  Nonce challenge{};
  if (size > 0 && data[0] % 2 == 0) {
    Hello h;
    h.transport = static_cast<uint16_t>(TransportId::kTcp);
    h.src = 1;
    h.dst = 0;
    sign_hello(h, key, challenge);
    std::string good(reinterpret_cast<const char*>(&h), sizeof(h));
    for (size_t i = 1; i + 1 < size; i += 2) good[data[i] % good.size()] = static_cast<char>(data[i + 1]);
    bytes = good;
  }
  HelloReader reader(UniqueFd(sv[0]), Clock::now() + std::chrono::milliseconds(50), challenge);
  size_t at = 0;
  for (int round = 0; round < 64; ++round) {
    if (at < bytes.size()) {
      size_t piece = 1 + (round * 7) % 29;
      ssize_t k = ::send(writer.get(), bytes.data() + at, std::min(piece, bytes.size() - at), MSG_NOSIGNAL);
      if (k > 0) at += static_cast<size_t>(k);
    } else {
      writer.reset();
    }
    auto state = reader.step();
    if (state == HelloReader::State::kFailed) break;
    if (state == HelloReader::State::kDone) {
      for (int size_of_job : {1, 2, 4, 1 << 20})
        (void)check_hello(reader.hello(), key, challenge, 0, size_of_job, TransportId::kTcp);
      break;
    }
  }
  return 0;
}
