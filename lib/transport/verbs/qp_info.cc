// The handshake extension: QpInfo encoding and validation.
#include "transport/verbs/verbs_transport.h"

#include "transport/verbs/verbs_internal.h"

namespace slotrpc::transport::verbs {

// ------------------------------------------------------------------ QpInfo
//
//   0  u32 magic "SRPV"     4 u16 version 1     6 u8 mtu (enum ibv_mtu)
//   7  u8 link layer        8 u32 qpn          12 u32 psn
//  16  16 B gid            32 u16 lid          34 u8 max_dest_rd_atomic (0: 1)
//  35  u8 zero
//  36  u32 ring rkey       40 u64 ring address
//  48  u32 slot_count      52 u32 slot_size    56 8 B zero

void encode_qp_info(const QpInfo& info, std::byte* out) {
  std::memset(out, 0, kQpInfoSize);
  put32(out + 0, kQpInfoMagic);
  put16(out + 4, kQpInfoVersion);
  out[6] = static_cast<std::byte>(info.mtu);
  out[7] = static_cast<std::byte>(info.link_layer);
  put32(out + 8, info.qpn);
  put32(out + 12, info.psn);
  std::memcpy(out + 16, info.gid.raw, 16);
  put16(out + 32, info.lid);
  out[34] = static_cast<std::byte>(info.max_dest_rd_atomic);
  put32(out + 36, info.ring_rkey);
  put64(out + 40, info.ring_addr);
  put32(out + 48, info.slot_count);
  put32(out + 52, info.slot_size);
}

Result<QpInfo> decode_qp_info(std::span<const std::byte> in) {
  auto bad = [](std::string why) {
    return Status(StatusCode::kUnavailable, "handshake failed: verbs extension: " + std::move(why));
  };
  if (in.size() != kQpInfoSize)
    return bad(fmt::format("{} bytes, expected {}", in.size(), kQpInfoSize));
  const std::byte* p = in.data();
  if (get32(p) != kQpInfoMagic) return bad("bad magic");
  if (get16(p + 4) != kQpInfoVersion)
    return bad(fmt::format("version {}, this end speaks {}", get16(p + 4), kQpInfoVersion));
  QpInfo info;
  info.mtu = std::to_integer<uint8_t>(p[6]);
  info.link_layer = std::to_integer<uint8_t>(p[7]);
  info.qpn = get32(p + 8);
  info.psn = get32(p + 12);
  std::memcpy(info.gid.raw, p + 16, 16);
  info.lid = get16(p + 32);
  info.max_dest_rd_atomic = std::to_integer<uint8_t>(p[34]);
  info.ring_rkey = get32(p + 36);
  info.ring_addr = get64(p + 40);
  info.slot_count = get32(p + 48);
  info.slot_size = get32(p + 52);
  if (mtu_bytes(info.mtu) == 0) return bad(fmt::format("unknown path MTU code {}", info.mtu));
  if (info.qpn == 0 || info.qpn > 0xffffffu) return bad(fmt::format("invalid QP number {}", info.qpn));
  if (info.psn > 0xffffffu) return bad(fmt::format("PSN {} exceeds 24 bits", info.psn));
  if (info.ring_addr == 0) return bad("no receive ring address");
  return info;
}

}  // namespace slotrpc::transport::verbs
