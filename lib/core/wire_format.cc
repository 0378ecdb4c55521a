#include "core/wire_format.h"

namespace slotrpc::core {

std::string_view to_string(HeaderError e) {
  switch (e) {
    case HeaderError::kOk: return "ok";
    case HeaderError::kTooShort: return "message shorter than the 32-byte header";
    case HeaderError::kBadMagic: return "bad magic";
    case HeaderError::kBadVersion: return "unsupported protocol version";
    case HeaderError::kBadKind: return "flags hold an unknown message kind or undefined flag bits";
    case HeaderError::kBadLength: return "payload length disagrees with the bytes received or exceeds the slot";
    case HeaderError::kBadSlot: return "slot index outside the ring";
    case HeaderError::kSlotMismatch: return "header slot differs from the slot written";
  }
  return "?";
}

}  // namespace slotrpc::core
