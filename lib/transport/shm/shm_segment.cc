#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace slotrpc::transport::shm {

std::string errno_text(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

namespace {

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

uint32_t next_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

constexpr int kOfferFds = 1;  // the memfd

}  // namespace

Mapping::~Mapping() {
  if (base_ != nullptr) ::munmap(base_, length_);
}
Mapping::Mapping(Mapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), length_(std::exchange(o.length_, 0)) {}
Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, length_);
    base_ = std::exchange(o.base_, nullptr);
    length_ = std::exchange(o.length_, 0);
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<Layout> compute_layout(Geometry g) {
  // The slot index travels in the low 16 bits of the immediate.
  if (g.slot_count == 0 || g.slot_count > 0x10000u)
    return Status(StatusCode::kInvalidArgument,
                  "shm: slot count " + std::to_string(g.slot_count) + " outside 1..65536");
  if (g.slot_size < transport::kHeaderSize)
    return Status(StatusCode::kInvalidArgument,
                  "shm: slot size " + std::to_string(g.slot_size) + " below the 32-byte header");
  Layout l;
  l.geometry = g;
  // One descriptor per slot message (at most slot_count in flight, the
  // credit protocol's bound) plus room for control messages (cancels,
  // grants, keepalives: at most a few per slot).  More than that waits in
  // the sender's backlog.
  l.desc_count = next_pow2(4 * g.slot_count + 64);
  l.desc_offset = kPage;
  l.bulk_desc_offset = l.desc_offset + size_t{l.desc_count} * sizeof(Descriptor);
  l.data_offset = round_up(l.bulk_desc_offset + size_t{kBulkDescCount} * sizeof(Descriptor), kPage);
  l.staging_offset = round_up(l.data_offset + size_t{g.slot_count} * g.slot_size, kPage);
  l.total = l.staging_offset + kStagingBytes;
  return l;
}

Result<OwnSegment> create_own_segment(Geometry g) {
  auto l = compute_layout(g);
  if (!l.ok()) return l.status();
  OwnSegment s;
  s.layout = l.value();
  s.memfd = Fd(::memfd_create("slotrpc-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (s.memfd.get() < 0) return Status(StatusCode::kUnavailable, errno_text("shm: memfd_create", errno));
  if (::ftruncate(s.memfd.get(), static_cast<off_t>(s.layout.total)) != 0)
    return Status(StatusCode::kUnavailable, errno_text("shm: ftruncate", errno));
  void* p = ::mmap(nullptr, s.layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, s.memfd.get(), 0);
  if (p == MAP_FAILED) return Status(StatusCode::kUnavailable, errno_text("shm: mmap", errno));
  s.map = Mapping(static_cast<std::byte*>(p), s.layout.total);
  // After our writable mapping exists: FUTURE_WRITE keeps it and refuses
  // every later one (the peer's mmap(PROT_WRITE), write(), mprotect).
  if (::fcntl(s.memfd.get(), F_ADD_SEALS,
              F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Status(StatusCode::kUnavailable, errno_text("shm: sealing the segment", errno));
  return s;
}

Status send_offer(int sock, const OwnSegment& own) {
  Offer o;
  o.slot_count = own.layout.geometry.slot_count;
  o.slot_size = own.layout.geometry.slot_size;
  o.desc_count = own.layout.desc_count;
  o.segment_bytes = own.layout.total;
  iovec iov{&o, sizeof o};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kOfferFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * kOfferFds);
  const int fds[kOfferFds] = {own.memfd.get()};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status(StatusCode::kUnavailable, errno_text("shm: sending the offer", errno));
    if (static_cast<size_t>(n) != sizeof o)
      return Status(StatusCode::kUnavailable, "shm: offer sent short");
    return Status::ok_status();
  }
}

Result<PeerSegment> receive_offer(int sock, Geometry g, std::chrono::milliseconds timeout) {
  auto want = compute_layout(g);
  if (!want.ok()) return want.status();
  const Layout& l = want.value();

  pollfd pfd{sock, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int r = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (r > 0) break;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status(StatusCode::kUnavailable, errno_text("shm: poll", errno));
    return Status(StatusCode::kDeadlineExceeded,
                  "shm: no offer from the peer within " + std::to_string(timeout.count()) + " ms");
  }

  Offer o{};
  iovec iov{&o, sizeof o};
  // Room for more fds than we want, so a peer sending extra ones is seen
  // (and they are closed) rather than silently truncated.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status(StatusCode::kUnavailable, errno_text("shm: receiving the offer", errno));

  std::vector<Fd> fds;  // every fd received is owned (and closed on error)
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.emplace_back(fd);
    }
  }
  if (n == 0) return Status(StatusCode::kUnavailable, "shm: peer closed the socket before its offer");
  if (static_cast<size_t>(n) != sizeof o || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0)
    return Status(StatusCode::kInvalidArgument,
                  "shm: malformed offer (" + std::to_string(n) + " bytes, expected " +
                      std::to_string(sizeof o) + ")");
  if (o.magic != kOfferMagic)
    return Status(StatusCode::kInvalidArgument, "shm: offer with a wrong magic (not a slotrpc shm peer)");
  if (o.version != kOfferVersion)
    return Status(StatusCode::kInvalidArgument,
                  "shm: the peer speaks shm offer version " + std::to_string(o.version) +
                      ", this side " + std::to_string(kOfferVersion) +
                      " (docs/protocol.md, \"Shared memory\"; run one slotrpc release on both sides)");
  if (o.slot_count != g.slot_count || o.slot_size != g.slot_size || o.desc_count != l.desc_count ||
      o.segment_bytes != l.total)
    return Status(StatusCode::kInvalidArgument,
                  "shm: peer offers " + std::to_string(o.slot_count) + " slots of " +
                      std::to_string(o.slot_size) + " bytes (" + std::to_string(o.desc_count) +
                      " descriptors), the session agreed on " + std::to_string(g.slot_count) +
                      " of " + std::to_string(g.slot_size) + " (" + std::to_string(l.desc_count) + ")");
  if (fds.size() != kOfferFds)
    return Status(StatusCode::kInvalidArgument,
                  "shm: offer carries " + std::to_string(fds.size()) + " fds, expected " +
                      std::to_string(kOfferFds) + " (the segment's memfd)");

  const int memfd = fds[0].get();
  struct stat st{};
  if (::fstat(memfd, &st) != 0) return Status(StatusCode::kUnavailable, errno_text("shm: fstat", errno));
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != l.total)
    return Status(StatusCode::kInvalidArgument,
                  "shm: peer's segment is not a memfd of " + std::to_string(l.total) + " bytes");
  const int seals = ::fcntl(memfd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return Status(StatusCode::kInvalidArgument,
                  "shm: peer's segment is not sealed against shrinking (it could be truncated "
                  "under our mapping)");

  void* p = ::mmap(nullptr, l.total, PROT_READ, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) return Status(StatusCode::kUnavailable, errno_text("shm: mmap of the peer's segment", errno));
  PeerSegment peer;
  peer.layout = l;
  peer.map = Mapping(static_cast<std::byte*>(p), l.total);
  // The mapping keeps the memory; the memfd itself is no longer needed.
  return peer;
}

}  // namespace slotrpc::transport::shm
