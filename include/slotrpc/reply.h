// Typed replies: a RawReply (raw.h) whose payload passed
// flatbuffers::Verifier for the reply type, read in place in its receive
// slot like the RawReply it holds.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "slotrpc/metadata.h"
#include "slotrpc/raw.h"
#include "slotrpc/status.h"

namespace slotrpc {

// A RawReply whose payload passed flatbuffers::Verifier for T.
template <class T>
class Reply {
 public:
  Reply() = default;
  // Verifies `raw`; a reply that fails becomes an INTERNAL status.  By
  // rvalue reference (a RawReply cannot be copied anyway): one move less.
  explicit Reply(RawReply&& raw) : raw_(std::move(raw)) {
    if (!raw_.ok()) return;
    flatbuffers::Verifier verifier(raw_.data(), raw_.size());
    if (!verifier.VerifyBuffer<T>(nullptr)) {
      raw_ = RawReply(Status(StatusCode::kInternal, "reply failed FlatBuffers verification"));
      return;
    }
    message_ = flatbuffers::GetRoot<T>(raw_.data());
  }

  const Status& status() const { return raw_.status(); }
  bool ok() const { return raw_.ok(); }
  // Null unless ok().
  const T* message() const { return message_; }
  const T* operator->() const { return message_; }
  const T& operator*() const { return *message_; }
  const RawReply& raw() const { return raw_; }
  uint64_t bulk_received(size_t i) const { return raw_.bulk_received(i); }
  const Metadata& trailers() const { return raw_.trailers(); }
  const std::string* trailer(std::string_view key) const { return raw_.trailer(key); }
  void release() {
    message_ = nullptr;
    raw_.release();
  }

 private:
  RawReply raw_;
  const T* message_ = nullptr;
};

}  // namespace slotrpc
