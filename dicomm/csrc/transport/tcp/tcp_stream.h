// One non-blocking TCP socket of a connection: a queue of outgoing frames (written with writev,
// several at once) and a buffered frame parser that lands data chunks straight in their target.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "transport/poller.h"
#include "transport/tcp/frame.h"
#include "transport/unique_fd.h"

namespace dicomm::transport::tcp {

class TcpStream {
 public:
  struct Handler {
    virtual ~Handler() = default;
    virtual void on_frame(const Frame& f, const char* payload) = 0;  // everything but kData
    virtual char* data_target(const Frame& f) = 0;                  // where a kData chunk lands
    virtual void on_data(const Frame& f) = 0;                       // a kData chunk has landed
    virtual void on_written(const Frame& f, void* cookie) = 0;      // an output frame has left
  };

  TcpStream(UniqueFd fd, Poller* poller, std::string what);
  // A data frame being read into [begin, end) goes on into scratch memory (a cancelled receive).
  void drop_data_into(const char* begin, const char* end);
  ~TcpStream();
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  void send(const Frame& f, const char* payload, void* cookie, Handler& h);  // queues, then flushes
  bool flush(Handler& h);
  // Reads and parses what has arrived. After an orderly EOF it returns false and eof() is set;
  // errors (a reset) throw PeerError. A stream whose peer broke the protocol (ProtocolError) stays
  // broken: every later read throws again instead of parsing what follows the bad frame.
  bool read(Handler& h);
  bool eof() const { return !eof_reason_.empty(); }
  const std::string& eof_reason() const { return eof_reason_; }
  bool has_output() const { return !out_.empty(); }
  const std::string& what() const { return what_; }

 private:
  struct Out {
    Frame frame;
    const char* payload = nullptr;
    size_t len = 0;
    size_t done = 0;  // over frame + payload
    void* cookie = nullptr;
  };
  enum class State { kHeader, kPayload, kData };
  bool parse(Handler& h);

  UniqueFd fd_;
  Poller* poller_;  // not owned: the engine's, which outlives its connections
  std::string what_;
  std::deque<Out> out_;
  bool want_write_ = false;
  std::string eof_reason_;
  std::string violation_;  // the ProtocolError this stream ended with

  std::vector<char> rx_;
  size_t begin_ = 0, end_ = 0;
  State state_ = State::kHeader;
  Frame cur_;
  char* target_ = nullptr;  // not owned: the matched receive's buffer (the engine's request holds it)
  size_t left_ = 0;
  std::vector<char> scratch_;  // where a cancelled receive's data goes
};

}  // namespace dicomm::transport::tcp
