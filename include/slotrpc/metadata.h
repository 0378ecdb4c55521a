// Call metadata: small key/value pairs a client sends with a call (headers:
// auth tokens, trace ids) and a server sends back with its final reply
// (trailers).  Carried in the call's slot; docs/protocol.md, "Call
// metadata", has the encoding.
//
// Keys are 1 to 255 bytes of a-z, 0-9, '-', '_' and '.' (gRPC's metadata
// names); values are any bytes.  All of a message's entries together take at
// most 8 KiB encoded (4 bytes per entry plus key and value, 8 per block),
// and must fit the slot beside the message: a call over either limit fails
// with RESOURCE_EXHAUSTED before anything is sent.  A call without metadata
// costs nothing for it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace slotrpc {

using Metadata = std::vector<std::pair<std::string, std::string>>;

}  // namespace slotrpc
