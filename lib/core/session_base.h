// What a reactor knows of a session: how to hand it a completion and how to
// ask it to flush.  Plain function pointers instead of virtual functions:
// the reactor calls these once per message, and the pointer is fixed per
// session kind, so the call is a predictable indirect branch with no vtable
// load.
#pragma once

#include "transport/transport.h"

#include <chrono>

namespace slotrpc::core {

using Clock = std::chrono::steady_clock;

struct SessionBase {
  using CompletionFn = void (*)(SessionBase*, const transport::Completion&);
  using FlushFn = void (*)(SessionBase*);

  CompletionFn on_completion = nullptr;
  FlushFn flush = nullptr;
  bool flush_queued = false;  // owned by the reactor's flush list
  // When the peer was last heard (core/liveness.h).  A message marks the
  // session (Reactor::heard) and the reactor stamps this once the turn's
  // completions have all been handed out: one clock read per turn for all
  // sessions, not one per message, and never earlier than the handling of
  // what arrived.
  bool heard_queued = false;  // owned by the reactor's heard list
  Clock::time_point last_heard{};
};

// The reactor's two entries into a session, one copy for both ends
// (SessionDispatch<S>::bind points a session's function pointers here): a
// completion goes to the session's handler of its kind.  `S` (a
// ClientSession or ServerSession, which befriend this) has
//   bool ignores(const Completion&)  what to drop unseen (the client: all
//                                    once closed, since a session closed
//                                    earlier in a batch has dropped the
//                                    link the rest may name);
//   on_message, on_control, on_link_down and on_bulk_completion, each
//   taking the Completion; and flush().
// Templates, so each S gets its own functions: the per-message call stays
// one predictable indirect branch to code that calls the handler directly.
template <class S>
struct SessionDispatch {
  static void bind(S* s) {
    s->on_completion = &SessionDispatch::on_completion;
    s->SessionBase::flush = &SessionDispatch::flush;
  }
  static void on_completion(SessionBase* base, const transport::Completion& c) {
    S* s = static_cast<S*>(base);
    if (s->ignores(c)) return;
    switch (c.kind) {
      case transport::Completion::Kind::kMessage:
        s->on_message(c);
        break;
      case transport::Completion::Kind::kControl:
        s->on_control(c);
        break;
      case transport::Completion::Kind::kLinkDown:
        s->on_link_down(c);
        break;
      case transport::Completion::Kind::kBulkDone:
        s->on_bulk_completion(c);
        break;
    }
  }
  static void flush(SessionBase* base) { static_cast<S*>(base)->flush(); }
};

}  // namespace slotrpc::core
