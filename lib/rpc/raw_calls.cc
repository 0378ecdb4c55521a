// slotrpc::raw: the untyped calls of slotrpc/raw.h.  They forward to the
// Channel's private members, which the typed templates of channel.h call
// too, so a raw call and a typed one take exactly the same path.
#include "slotrpc/raw.h"

#include "slotrpc/channel.h"

namespace slotrpc::detail {

const Metadata& no_trailers() {
  static const Metadata none;
  return none;
}

}  // namespace slotrpc::detail

namespace slotrpc::raw {

Future<RawReply> call(Channel& channel, uint32_t method_id, RequestWriter writer, CallOptions options) {
  return channel.call(method_id, std::move(writer), std::move(options));
}

Future<RawReply> call(Channel& channel, uint32_t method_id, RequestWriter writer) {
  return call(channel, method_id, std::move(writer), CallOptions{});
}

CallHandle call(Channel& channel, uint32_t method_id, RequestWriter writer, CallOptions options,
                ReplySink sink) {
  return channel.call(method_id, std::move(writer), std::move(options), std::move(sink));
}

CallHandle call_stream(Channel& channel, uint32_t method_id, RequestWriter writer, CallOptions options,
                       ReplySink on_message, std::function<void(Status)> on_end) {
  return channel.call_stream(method_id, std::move(writer), std::move(options), std::move(on_message),
                             std::move(on_end));
}

std::shared_ptr<detail::OutStreamState> open_stream(Channel& channel, uint32_t method_id, bool bidi,
                                                    CallOptions options, ReplySink on_reply,
                                                    std::function<void(Status)> on_end) {
  return channel.open_stream(method_id, bidi, std::move(options), std::move(on_reply), std::move(on_end));
}

}  // namespace slotrpc::raw
