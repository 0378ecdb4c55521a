// The raw call's types stand on their own: slotrpc/raw.h is enough for
// code that handles untyped replies (RawReply, RequestWriter, ReplySink),
// and what the client session fills into a RawReply is not public.
#include <slotrpc/raw.h>

#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

template <class T>
concept FillsExtras = requires(T& r) { r.set_extras(nullptr); };

static_assert(!FillsExtras<slotrpc::RawReply>,
              "RawReply::set_extras (bulk lengths, trailers) is the client session's, not the API's");
static_assert(std::is_invocable_v<slotrpc::ReplySink, slotrpc::RawReply&&>);
static_assert(std::is_invocable_v<slotrpc::RequestWriter, flatbuffers::FlatBufferBuilder&>);

}  // namespace

TEST_CASE("raw.h: a RawReply carries a status and no payload until a session fills it") {
  slotrpc::RawReply failed(slotrpc::Status(slotrpc::StatusCode::kUnavailable, "no session"));
  CHECK_FALSE(failed.ok());
  CHECK(failed.status().code() == slotrpc::StatusCode::kUnavailable);
  CHECK(failed.payload().empty());
  CHECK(failed.bulk_received(0) == 0);
  slotrpc::RawReply moved;
  slotrpc::ReplySink sink = [&moved](slotrpc::RawReply&& r) { moved = std::move(r); };
  sink(std::move(failed));
  CHECK(moved.status().message() == "no session");
}
