// HTTP/1.1 POSTs to etcd's v3 JSON gateway (lib/rpc/discovery): one
// connection per request ("Connection: close"), Beast's parser for the
// answer, and the socket's reads and writes by poll() so that each waits at
// most its timeout and an Interrupt ends them at once.  Asio's synchronous
// calls can do neither (they retry a timed-out read forever), and an async
// io_context per resolver would be a second event loop for a few requests a
// second.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "base/address.h"
#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc::rpc::discovery {

// Wakes every wait of the requests that were given it, for good: how a
// resolver's or a registration's stop() ends a watch that would block.
class Interrupt {
 public:
  Interrupt();
  ~Interrupt();
  Interrupt(const Interrupt&) = delete;
  Interrupt& operator=(const Interrupt&) = delete;
  void fire();
  bool fired() const { return fired_.load(); }
  int fd() const { return fd_; }
  // Sleeps for `d` or until fire(), whichever first; false once fired.
  bool sleep_for(std::chrono::milliseconds d) const;

 private:
  int fd_ = -1;  // an eventfd, readable once fired
  std::atomic<bool> fired_{false};
};

// POSTs `body` (JSON) to http://ENDPOINT`path`; the answer's body if the
// status is 200.  UNAVAILABLE when the server cannot be reached, does not
// answer within `timeout`, or answers another status (named, with the body);
// CANCELLED when `interrupt` fired.
Result<std::string> http_post(const base::Endpoint& endpoint, const std::string& path,
                              const std::string& body, std::chrono::milliseconds timeout,
                              const Interrupt& interrupt);

// As http_post, for a streaming answer: each line of the body goes to
// `on_line` as it arrives (false from it ends the request).  Waits as long
// as the server keeps the answer open; `timeout` bounds the connect and the
// header.  Returns when the answer ends (UNAVAILABLE: the server closed it),
// on_line said stop (OK), or `interrupt` fired (CANCELLED).
Status http_post_lines(const base::Endpoint& endpoint, const std::string& path, const std::string& body,
                       std::chrono::milliseconds timeout, const Interrupt& interrupt,
                       const std::function<bool(std::string_view)>& on_line);

}  // namespace slotrpc::rpc::discovery
