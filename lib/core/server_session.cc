#include "core/server_session.h"

#include "core/metadata.h"

#include <boost/context/fiber.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/bulk/descriptors.h"
#include "core/handshake.h"
#include "core/bulk/registration_cache.h"
#include "base/logging.h"

namespace slotrpc::core {

namespace {

// A handler's mistake (it threw, returned OK without finishing its reply,
// or returned a number that is no status code) reaches the client as
// INTERNAL; the server's log says so too, once per method and then at most
// once every kMistakeLogEvery, with how many it left out.  Mistakes are
// rare and this is their path only, so one lock for every loop is fine.
constexpr auto kMistakeLogEvery = std::chrono::seconds(10);

void log_handler_mistake(const std::string& method, const Status& status) {
  struct Entry {
    std::chrono::steady_clock::time_point last{};
    uint64_t unlogged = 0;
  };
  static std::mutex mu;
  static auto* entries = new std::unordered_map<std::string, Entry>;  // never freed: loops may log at exit
  const auto now = std::chrono::steady_clock::now();
  uint64_t left_out = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, first] = entries->try_emplace(method);
    Entry& e = it->second;
    if (!first && now - e.last < kMistakeLogEvery) {
      ++e.unlogged;
      return;
    }
    left_out = e.unlogged;
    e.unlogged = 0;
    e.last = now;
  }
  base::log().warn("slotrpc: handler mistake in {}: the client gets {} (logged at most once every {} s per "
             "method; {} more since the last line)",
             method, status.to_string(), kMistakeLogEvery.count(), left_out);
}

}  // namespace

ServerSession::ServerSession(core::Loop& loop, std::unique_ptr<transport::Link> link,
                             Geometry g, const MethodTable& methods, std::string peer,
                             ClosedFn on_closed)
    : loop_(loop),
      link_(std::move(link)),
      geometry_(g),
      methods_(methods),
      peer_(std::move(peer)),
      on_closed_(std::move(on_closed)),
      recv_ring_(g.slot_count, g.slot_size),
      // In the link's shared memory when it has some (shm): requests and
      // replies are built where the peer reads them (core/slot_ring.h).
      // link_ is declared, so initialised, before send_ring_.
      send_ring_(g.slot_count, g.slot_size, link_ ? link_->send_slots() : std::span<std::byte>{}),
      slots_(g.slot_count),
      bulk_(g.slot_count),
      in_owner_(g.slot_count, -1),
      in_next_(g.slot_count, -1),
      in_generation_(g.slot_count, 0),
      in_len_(g.slot_count, 0),
      granted_to_(g.slot_count, -1),
      grant_generation_(g.slot_count, 0),
      outbox_(g.slot_count),
      liveness_(last_heard, Clock::now()) {
  SessionDispatch<ServerSession>::bind(this);
  builders_.reserve(g.slot_count);
  writers_.reserve(g.slot_count);
  inbound_.resize(g.slot_count);
  for (uint32_t i = 0; i < g.slot_count; ++i) {
    builders_.push_back(std::make_unique<SlotBuilder>(send_ring_.slot(i), g.slot_size));
    writers_.emplace_back(this, static_cast<uint16_t>(i));
    inbound_[i].read = &ServerSession::read_inbound;
    inbound_[i].session = this;
    inbound_[i].slot = static_cast<uint16_t>(i);
  }
}

Result<std::unique_ptr<ServerSession>> ServerSession::create(
    core::Loop& loop, std::unique_ptr<transport::Link> link, Geometry g,
    const MethodTable& methods, std::string peer, ClosedFn on_closed) {
  std::unique_ptr<ServerSession> s(
      new ServerSession(loop, std::move(link), g, methods, std::move(peer), std::move(on_closed)));
  Status st = s->send_ring_.register_with(*s->link_, transport::Access::kLocalSend);
  if (st.ok()) st = s->recv_ring_.register_with(*s->link_, transport::Access::kRemoteWrite);
  if (st.ok())
    st = s->link_->attach(s->recv_ring_.region(), s->send_ring_.region(), g.slot_count,
                          g.slot_size, static_cast<SessionBase*>(s.get()));
  if (!st.ok()) return st;
  for (uint32_t i = 0; i < g.slot_count; ++i) s->link_->arm(static_cast<uint16_t>(i));
  // The registration cache deregisters the handlers' bulk memory through a
  // live link of its domain (lib/core/bulk/registration_cache.h).
  bulk::RegistrationCache::instance().link_up(*s->link_);
  s->arm_keepalive();
  return s;
}

ServerSession::~ServerSession() {
  loop_.timers().cancel(keepalive_timer_);
  loop_.forget(this);
  if (link_) owner_counters().retire_link(*link_);
  // The rings were registered through the link: deregister them first.
  send_ring_.deregister();
  recv_ring_.deregister();
  if (link_) bulk::RegistrationCache::instance().link_down(*link_);
  link_.reset();
}

// A handler's read_bulk / write_bulk: its fiber waits for this, even on a
// closed session (the link reports before its kLinkDown).
void ServerSession::on_bulk_completion(const transport::Completion& c) {
  const uint16_t slot = bulk::ServerCallBulk::slot_of(c.bulk_token);
  if (slot < bulk_.size() && bulk_[slot]) bulk_[slot]->on_done(c.bulk_token, c.bulk_status);
}

void ServerSession::on_message(const transport::Completion& c) {
  if (closed_) return;
  loop_.heard(this);
  const std::byte* bytes = recv_ring_.slot(c.slot);
  const Header h = decode_header(bytes);
  HeaderError e = validate_header(h, c.length, geometry_.slot_count, geometry_.slot_size, c.slot);
  if (e != HeaderError::kOk) {
    return protocol_error(fmt::format("malformed request header in slot {}: {}", c.slot, to_string(e)));
  }
  if (h.kind() == Kind::kPack) return on_pack(c, h);
  if (h.kind() == Kind::kClientMessage) return on_client_message(c, h);
  if (h.kind() != Kind::kRequest) {
    return protocol_error(fmt::format("unexpected message kind 0x{:02x} in slot {}", h.flags, h.slot));
  }
  if (imm_generation(c.imm) != static_cast<uint16_t>(h.generation)) {
    return protocol_error(fmt::format("slot {}: immediate and header disagree on the generation", h.slot));
  }
  Slot& s = slots_[h.slot];
  if (s.state != SlotState::kIdle) {
    return protocol_error(fmt::format("request written into slot {} while it is still busy", h.slot));
  }
  if (granted_to_[h.slot] >= 0) {
    return protocol_error(fmt::format("request written into slot {}, which is lent to a stream", h.slot));
  }
  if (in_owner_[h.slot] >= 0) {
    return protocol_error(fmt::format(
        "request written into slot {}, which holds an unacknowledged stream message", h.slot));
  }
  // Metrics (plain integers of this loop, no allocation: every method's
  // entry exists since the server started).
  core::SideCounters& counters = owner_counters().server;
  ++counters.calls.started;
  counters.calls.bytes_in += c.length;
  s.state = SlotState::kRunning;
  s.cancelled = false;
  s.streaming = h.server_stream();
  s.client_stream = h.client_stream();
  s.half_closed = false;
  s.in_head = s.in_tail = s.in_held = -1;
  s.cancel_code = StatusCode::kCancelled;
  s.in_invalid = false;
  s.grants.clear();
  s.grant_head = 0;
  s.waiter = nullptr;
  s.read_waiter = nullptr;
  s.generation = h.generation;
  s.request_id = h.request_id;
  s.payload_len = h.payload_len;
  s.payload_offset = 0;
  s.meta_len = 0;  // s.trailers: emptied by the last reply that had some (build_final)
  s.bulk = false;
  s.timeout_us = h.timeout_us;
  s.received = loop_.received_at();
  // The method and its counters: two hash lookups, done again only when
  // the method differs from the last call's (the table is frozen, and
  // counter entries are never erased, so the pointers stay valid).
  if (h.method_id != last_method_.id || last_method_.side != &counters || last_method_.counters == nullptr) {
    const MethodDescriptor* m = methods_.find(h.method_id);
    core::MethodCounters* mc = nullptr;
    if (m != nullptr) {
      auto it = counters.methods.find(h.method_id);
      if (it != counters.methods.end()) mc = &it->second;
    }
    last_method_ = {h.method_id, &counters, m, mc};
  }
  s.method = last_method_.method;
  s.counters = last_method_.counters;
  if (s.counters != nullptr) {
    ++s.counters->started;
    s.counters->bytes_in += c.length;
  }

  if (s.method == nullptr) {
    return send_reply(h.slot, Status(StatusCode::kUnimplemented,
                                     fmt::format("no method with id 0x{:08x} on this server", h.method_id)));
  }
  const MethodKind called = s.client_stream
                               ? (s.streaming ? MethodKind::kBidiStream : MethodKind::kClientStream)
                               : (s.streaming ? MethodKind::kServerStream : MethodKind::kUnary);
  if (s.method->kind != called) {
    auto name = [](MethodKind k) {
      switch (k) {
        case MethodKind::kUnary: return "unary";
        case MethodKind::kServerStream: return "server-streaming";
        case MethodKind::kClientStream: return "client-streaming";
        case MethodKind::kBidiStream: return "bidi-streaming";
      }
      return "?";
    };
    return send_reply(h.slot, Status(StatusCode::kInvalidArgument,
                                     fmt::format("{} is a {} method but was called as {}",
                                                 s.method->full_name, name(s.method->kind),
                                                 name(called))));
  }
  if ((h.flags & (kFlagMetadata | kFlagBulk)) != 0) [[unlikely]] {
    if (h.metadata()) {
      // Checked whole before the handler runs (it reads the block in
      // place); a malformed one fails this call only.
      auto len = check_metadata_block({bytes + kHeaderSize, h.payload_len});
      if (!len.ok()) return send_reply(h.slot, Status(len.status()));
      s.meta_len = static_cast<uint32_t>(len.value());
      s.payload_offset = s.meta_len;
      s.payload_len = h.payload_len - s.meta_len;
    }
    if (h.bulk()) {
      if (Status st = begin_bulk(h.slot, bytes + kHeaderSize + s.payload_offset, s.payload_len); !st.ok())
        return send_reply(h.slot, std::move(st));
    }
  }
  if (s.method->verify != nullptr &&
      !s.method->verify(reinterpret_cast<const uint8_t*>(bytes + kHeaderSize + s.payload_offset),
                        s.payload_len)) {
    return send_reply(h.slot, Status(StatusCode::kInvalidArgument,
                                     fmt::format("request to {} failed FlatBuffers verification",
                                                 s.method->full_name)));
  }
  ++running_;
  loop_.spawn(&ServerSession::run_handler, this, h.slot);
}

// A PACK of requests (lib/core/pack.h): the whole pack is checked first,
// every request against an idle slot the client may write; only then is
// each copied into its own slot and handled exactly as if it had come
// alone (so its handler reads it in place there).  Anything wrong closes
// the session, like a bad frame.
void ServerSession::on_pack(const transport::Completion& c, const Header& h) {
  if (!pack_) {
    return protocol_error(fmt::format("PACK in slot {}, but this server did not announce packing", c.slot));
  }
  // Each packed request needs an idle slot the client may write.
  auto accept = [this, &c](const PackedEntry& e) -> std::string {
    const uint16_t j = e.header.slot;
    if (slots_[j].state != SlotState::kIdle || granted_to_[j] >= 0 || in_owner_[j] >= 0 ||
        (j != c.slot && !link_->armed(j))) {
      return fmt::format("packed request for slot {}, which is not idle", j);
    }
    return {};
  };
  const std::string bad =
      pack_->receive(recv_ring_.slot(0), geometry_.slot_count, geometry_.slot_size, *link_, c, h,
                     PackSender::kClient, accept, [this] { return !closed_; },
                     [this](const transport::Completion& inner) { on_message(inner); });
  if (!bad.empty()) protocol_error(bad);
}

void ServerSession::configure_packing(uint32_t pack_small, bool client_accepts) {
  if (pack_small == 0) return;
  pack_ = std::make_unique<PackReceiver>(geometry_.slot_count);
  if (client_accepts) outbox_.enable_packing(send_ring_.slot(0), geometry_.slot_size, pack_small);
}

// A request with bulk segments: its descriptor block is checked (a block
// that is malformed or offers more than max_bulk_bytes fails this call
// only) and handed to the slot's ServerCallBulk for the handler.
Status ServerSession::begin_bulk(uint16_t slot, const std::byte* payload, uint32_t payload_len) {
  if (!link_->supports_bulk())
    return Status(StatusCode::kUnimplemented,
                  "bulk segments are not supported on " + link_->describe());
  if (slots_[slot].streaming || slots_[slot].client_stream)
    return Status(StatusCode::kInvalidArgument, "bulk segments are for unary calls");
  auto block = bulk::decode_request_block({payload, payload_len}, max_bulk_bytes_);
  if (!block.ok()) return block.status();
  if (!bulk_[slot]) {
    auto close = [](void* self, std::string reason) {
      static_cast<ServerSession*>(self)->close(std::move(reason));
    };
    bulk_[slot] = std::make_unique<bulk::ServerCallBulk>(loop_, *link_, slot, &closed_, close, this,
                                                         bulk_timeout_ms_);
  }
  bulk_[slot]->begin(block.value());
  Slot& s = slots_[slot];
  s.bulk = true;
  s.payload_offset += static_cast<uint32_t>(block.value().bytes());  // after any metadata
  s.payload_len = payload_len - static_cast<uint32_t>(block.value().bytes());
  return {};
}

void ServerSession::run_handler(void* self_ptr, uint64_t slot_index) {
  auto* self = static_cast<ServerSession*>(self_ptr);
  const auto slot = static_cast<uint16_t>(slot_index);
  Slot& s = self->slots_[slot];
  SlotBuilder& b = *self->builders_[slot];
  b.Clear();

  ServerCall call;
  call.request_ = {self->recv_ring_.slot(slot) + kHeaderSize + s.payload_offset, s.payload_len};
  call.reply_ = &b;
  call.cancelled_ = &s.cancelled;
  if (s.timeout_us != 0) call.deadline_ = s.received + std::chrono::microseconds(s.timeout_us);
  if (s.bulk) {
    call.bulk_ = self->bulk_[slot].get();
    self->bulk_[slot]->set_deadline(call.deadline_);
  }
  call.method_name_ = &s.method->full_name;
  call.method_id_ = s.method->id;
  call.peer_ = &self->peer_;
  call.peer_info_ = &self->peer_info_;
  if (s.meta_len != 0) call.metadata_ = {self->recv_ring_.slot(slot) + kHeaderSize, s.meta_len};
  call.trailers_ = &s.trailers;
  if (s.streaming) call.stream_ = &self->writers_[slot];
  if (s.client_stream) call.inbound_ = &self->inbound_[slot];

  Status status;
  bool mistake = false;  // logged below (log_handler_mistake)
  try {
    // The server's checks first (Admin's rule, interceptors): a refusal is
    // the call's answer and the handler never sees the call.
    const bool refused = self->checks_ != nullptr && !(status = self->checks_->run(call)).ok();
    if (!refused) status = s.method->handler(call);
    if (refused && !is_known_status_code(static_cast<uint16_t>(status.code()))) {
      status = Status(StatusCode::kInternal,
                      fmt::format("an interceptor refused {} with unknown status code {}: {}",
                                  s.method->full_name, static_cast<unsigned>(status.code()),
                                  status.message()));
      mistake = true;
    } else if (refused) {
      // As the interceptor said.
    } else if (status.ok() && !s.streaming && !b.is_finished()) {
      status = Status(StatusCode::kInternal,
                      fmt::format("{} returned OK without finishing its reply", s.method->full_name));
      mistake = true;
    } else if (!is_known_status_code(static_cast<uint16_t>(status.code()))) {
      // The client would take an unknown code for a protocol violation.
      status = Status(StatusCode::kInternal,
                      fmt::format("{} returned unknown status code {}: {}", s.method->full_name,
                                  static_cast<unsigned>(status.code()), status.message()));
      mistake = true;
    }
  } catch (const base::FiberUnwind&) {
    throw;  // the server is being destroyed while this handler waits
  } catch (const boost::context::detail::forced_unwind&) {
    throw;
  } catch (const SlotOverflow& o) {
    b.recover();
    status = Status(StatusCode::kResourceExhausted,
                    fmt::format("the server's reply of {}, at least {} bytes, does not fit a slot ({} bytes "
                                "of payload); raise slot_size (SLOTRPC_SLOT_SIZE) or return the data as a "
                                "bulk segment (ServerCall::write_bulk)",
                                s.method->full_name, o.at_least(), b.payload_capacity()));
  } catch (const std::exception& e) {
    b.recover();
    status = Status(StatusCode::kInternal,
                    fmt::format("{} threw: {}", s.method->full_name, e.what()));
    mistake = true;
  } catch (...) {
    b.recover();
    status = Status(StatusCode::kInternal,
                    fmt::format("{} threw a non-standard exception", s.method->full_name));
    mistake = true;
  }
  if (mistake) log_handler_mistake(s.method->full_name, status);
  if (status.ok() && s.in_invalid) {
    status = Status(StatusCode::kInvalidArgument,
                    fmt::format("a client stream message to {} failed FlatBuffers verification",
                                s.method->full_name));
  }
  --self->running_;
  if (self->closed_) {
    // No reply can go out: the call ends here, as the client sees it.
    if (s.bulk) {
      self->bulk_[slot]->end();
      self->count_bulk(s, *self->bulk_[slot]);
      s.bulk = false;
    }
    self->count_finished(s, StatusCode::kUnavailable);
    return self->maybe_finished();
  }
  self->send_reply(slot, std::move(status));
}

void ServerSession::send_reply(uint16_t slot, Status&& status) {
  Slot& s = slots_[slot];
  SlotBuilder& b = *builders_[slot];
  Header h;
  h.request_id = s.request_id;
  h.slot = slot;
  h.generation = s.generation;
  std::byte* msg;
  if (status.ok() && !s.streaming && !s.client_stream && !s.bulk && s.trailers.empty()) [[likely]] {
    // A unary call's reply, finished in its send slot (run_handler made an
    // OK without Finish() an INTERNAL): the header goes right before it.
    h.flags = static_cast<uint8_t>(Kind::kReply);
    h.payload_len = b.GetSize();
    msg = b.message_begin();
  } else {
    msg = build_final(slot, status, h);
  }
  encode_header(h, msg);
  owner_counters().server.calls.bytes_out += kHeaderSize + h.payload_len;
  if (s.counters != nullptr) s.counters->bytes_out += kHeaderSize + h.payload_len;
  count_finished(s, status.code());  // drops s.counters
  s.state = SlotState::kIdle;
  s.method = nullptr;
  s.streaming = false;
  s.client_stream = false;
  link_->arm(slot);  // the client may write this slot again once it has the reply
  outbox_.add_slot_message(msg, static_cast<uint32_t>(kHeaderSize + h.payload_len), slot,
                           s.generation, /*packable=*/true);
  loop_.request_flush(this);
  if (outbox_.flush_due()) flush();
}

std::byte* ServerSession::build_final(uint16_t slot, Status& status, Header& h) {
  // A handler's code outside 0..16 was made INTERNAL by run_handler(); the
  // other callers pass codes of their own.
  if (!client_all_codes_ && !is_first_version_status(status.code())) {
    // An older client would close the session on this code (handshake.h).
    status = Status(StatusCode::kInternal,
                    fmt::format("{}: {}", status_code_name(status.code()), status.message()));
  }
  Slot& s = slots_[slot];
  SlotBuilder& b = *builders_[slot];
  if (s.streaming) release_grants(slot);
  // Every client message the handler did not read is acknowledged before
  // the final message, so the client has its slots back in order.
  if (s.client_stream) release_inbound(slot);
  std::byte* msg;
  size_t block = 0;
  // Trailers (ServerCall::add_trailer) go right after the header, to a
  // client that takes them; one test when there are none.
  size_t tblock = 0;
  if (!s.trailers.empty() && client_trailers_) {
    auto bytes = metadata_block_bytes(s.trailers, fmt::format("trailers of {}", s.method != nullptr ? s.method->full_name : std::string("?")));
    if (bytes.ok()) {
      tblock = bytes.value();
    } else {
      status = bytes.status();
      s.trailers.clear();
    }
  }
  if (s.bulk) {
    bulk_[slot]->end();  // no transfer of this call can start any more
    count_bulk(s, *bulk_[slot]);
    s.bulk = false;
    block = bulk::reply_block_bytes(bulk_[slot]->written().size());
    if (status.ok() && b.is_finished() && b.GetSize() + block + tblock > b.payload_capacity()) {
      status = Status(StatusCode::kResourceExhausted,
                      fmt::format("reply of {} bytes plus its {}-byte bulk block does not fit a "
                                  "slot ({} bytes of payload)",
                                  b.GetSize(), block, b.payload_capacity()));
    }
  }
  if (tblock != 0 && status.ok() && !s.streaming && b.is_finished() &&
      b.GetSize() + block + tblock > b.payload_capacity()) {
    status = Status(StatusCode::kResourceExhausted,
                    fmt::format("reply of {} bytes plus {} bytes of trailers does not fit a slot ({} "
                                "bytes of payload)",
                                b.GetSize(), tblock, b.payload_capacity()));
  }
  if (status.ok() && !s.streaming && block != 0) {
    // The bulk block goes between the header and the FlatBuffer, which
    // ends at the end of the slot and keeps its alignment (block % 8 == 0).
    h.flags = static_cast<uint8_t>(Kind::kReply) | kFlagBulk;
    h.payload_len = static_cast<uint32_t>(tblock + block + b.GetSize());
    msg = b.message_begin() - block - tblock;
    bulk::encode_reply_block(bulk_[slot]->written(), msg + kHeaderSize + tblock);
  } else if (status.ok() && !s.streaming) {
    h.flags = static_cast<uint8_t>(Kind::kReply);
    h.payload_len = static_cast<uint32_t>(tblock + b.GetSize());
    msg = b.message_begin() - tblock;
  } else {
    // The end of a stream (no payload) or an error (its message as the
    // payload, cut to what fits): written at the start of the slot, without
    // the builder, which may never have been used.
    b.Clear();
    msg = b.slot();
    if (tblock > b.payload_capacity()) tblock = 0;  // a tiny slot: the status goes alone
    const std::string& text = status.message();
    const size_t n = status.ok() ? 0 : std::min(text.size(), b.payload_capacity() - tblock);
    std::memcpy(msg + kHeaderSize + tblock, text.data(), n);
    h.flags = static_cast<uint8_t>(status.ok() ? Kind::kReply : Kind::kError);
    h.status = static_cast<uint16_t>(status.code());
    h.payload_len = static_cast<uint32_t>(tblock + n);
  }
  if (tblock != 0) {
    h.flags |= kFlagMetadata;
    encode_metadata(s.trailers, msg + kHeaderSize, tblock);
  }
  // Sent or dropped: the slot's next call starts without them, and the
  // unary path's one test (send_reply) finds them empty.
  if (!s.trailers.empty()) s.trailers.clear();
  return msg;
}

// Cold path (a call with bulk segments ends): what its handler moved.
void ServerSession::count_bulk(Slot& s, const bulk::ServerCallBulk& b) {
  CallCounters& calls = owner_counters().server.calls;
  calls.bulk_bytes_in += b.bytes_read();
  calls.bulk_bytes_out += b.bytes_written();
  if (s.counters != nullptr) {
    s.counters->bulk_bytes_in += b.bytes_read();
    s.counters->bulk_bytes_out += b.bytes_written();
  }
}

// Hot path: a clock read and a few increments of this loop's counters.
void ServerSession::count_finished(Slot& s, StatusCode code) {
  ++owner_counters().server.calls.finished[core::code_index(code)];
  if (s.counters != nullptr) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - s.received);
    s.counters->finish(code, static_cast<uint64_t>(std::max<int64_t>(0, us.count())));
    s.counters = nullptr;
  }
}

void ServerSession::on_control(const transport::Completion& c) {
  if (closed_) return;
  loop_.heard(this);
  const Header h = decode_header(c.control.data());
  HeaderError e = validate_header(h, kHeaderSize, geometry_.slot_count, geometry_.slot_size, h.slot);
  if (e != HeaderError::kOk) {
    return protocol_error(fmt::format("malformed control header: {}", to_string(e)));
  }
  switch (h.kind()) {
    case Kind::kCancel: {
      Slot& s = slots_[h.slot];
      // A cancel may cross the reply on the wire; then there is nothing to do.
      if (s.state == SlotState::kRunning && s.generation == h.generation) {
        s.cancelled = true;
        // Why, from a client that says (older ones send 0).
        if (h.status == static_cast<uint16_t>(StatusCode::kDeadlineExceeded))
          s.cancel_code = StatusCode::kDeadlineExceeded;
        wake_writer(s);
      }
      return;
    }
    case Kind::kHalfClose:
      return on_half_close(h);
    case Kind::kStreamGrant:
      return on_grant(h);
    case Kind::kPing:
      // Coalesced: one PONG per flush answers every PING since the last.
      if (closed_) return;
      outbox_.owe_pong(h.request_id);
      return loop_.request_flush(this);
    case Kind::kPong:
      return;
    default:
      return protocol_error(fmt::format("unexpected control kind 0x{:02x}", h.flags));
  }
}

void ServerSession::send_control(Kind kind, uint16_t slot, uint32_t generation,
                                 uint64_t request_id, uint32_t aux) {
  if (closed_) return;
  if (!outbox_.has_control_room()) flush();
  outbox_.add_control(control_header(kind, slot, generation, request_id, aux));
  loop_.request_flush(this);
}

void ServerSession::flush() {
  if (closed_) return outbox_.clear();
  outbox_.post_to(*link_);
}

void ServerSession::protocol_error(std::string reason) {
  base::log().error("slotrpc: closing session with {}: protocol error: {}", peer_, reason);
  close("protocol error: " + reason);
}

void ServerSession::close(std::string reason) {
  if (closed_) return;
  closed_ = true;
  base::log().info("slotrpc: session with {} closed: {}", peer_, reason);
  loop_.timers().cancel(keepalive_timer_);
  keepalive_timer_ = 0;
  outbox_.clear();
  loop_.forget(this);
  link_->close(reason);
  // Tell the running handlers their calls are over.
  for (Slot& s : slots_) {
    s.cancelled = true;
    wake_writer(s);
  }
  maybe_finished();
}

void ServerSession::maybe_finished() {
  if (!closed_ || running_ != 0 || close_reported_) return;
  close_reported_ = true;
  // Destroyed by the owner from a fresh task: never from inside our own frames.
  ClosedFn fn = on_closed_;
  loop_.post([fn, this] { fn(this); });
}

// The liveness timer fires when something is due (core/liveness.h), not on
// a fixed period, so a silent client is closed peer_timeout_ms after it was
// last heard, within a timer tick.
}  // namespace slotrpc::core
