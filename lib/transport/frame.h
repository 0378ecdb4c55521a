// What a transport knows of the message format: every message starts with
// a header of kHeaderSize bytes (control messages are exactly that), and a
// slot message carries a 32-bit immediate whose low 16 bits name the slot
// it was written to.  The header's fields belong to the protocol core
// (core/wire_format.h, docs/protocol.md); transports never read them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slotrpc::transport {

inline constexpr size_t kHeaderSize = 32;

// Immediate data (RDMA WRITE_WITH_IMM, and the TCP frame prefix): the low
// 16 bits are the slot index the bytes were written to, the high 16 the low
// bits of the generation.  Transports read only the slot.
constexpr uint32_t make_imm(uint16_t slot, uint32_t generation) {
  return uint32_t{slot} | (generation << 16);
}
constexpr uint16_t imm_slot(uint32_t imm) { return static_cast<uint16_t>(imm & 0xffff); }
constexpr uint16_t imm_generation(uint32_t imm) { return static_cast<uint16_t>(imm >> 16); }

}  // namespace slotrpc::transport
