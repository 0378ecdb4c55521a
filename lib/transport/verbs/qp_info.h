// The verbs handshake extension (docs/protocol.md, section 7): what each end
// tells the other of its queue pair and receive ring.  One definition for
// both builds: a TCP-only build (verbs_disabled.h) still has to read a
// verbs proposal to answer it with tcp, so this header needs nothing from
// <infiniband/verbs.h>; the GID travels as its 16 raw bytes (ibv_gid's
// `raw`), copied in and out where the verbs code meets an ibv_gid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "slotrpc/result.h"

namespace slotrpc::transport::verbs {

inline constexpr size_t kQpInfoSize = 64;
inline constexpr uint32_t kQpInfoMagic = 0x56505253;  // "SRPV"
inline constexpr uint16_t kQpInfoVersion = 1;

struct QpInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
  struct {
    uint8_t raw[16];
  } gid{};
  uint16_t lid = 0;
  uint8_t mtu = 0;         // enum ibv_mtu of the sender's port
  uint8_t link_layer = 0;  // IBV_LINK_LAYER_*
  uint64_t ring_addr = 0;  // the sender's receive ring
  uint32_t ring_rkey = 0;
  uint32_t slot_count = 0;
  uint32_t slot_size = 0;
  // RDMA READs the sender answers at once (its max_dest_rd_atomic); 0 from
  // a peer that predates bulk transfers, which answered one.
  uint8_t max_dest_rd_atomic = 0;
};
void encode_qp_info(const QpInfo& info, std::byte* out);  // kQpInfoSize bytes
Result<QpInfo> decode_qp_info(std::span<const std::byte> in);

}  // namespace slotrpc::transport::verbs
