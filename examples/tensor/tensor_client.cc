// tensor_client: moves float32 tensors through a tensor_server both ways
// and checks every byte (examples/tensor/tensor.fbs).
//
//   build/examples/tensor/tensor_client --connect 127.0.0.1:7002 --size 1G
//
// Put sends tensor A (registered once with Channel::register_memory: the
// NIC reads it in place), Get brings it back into another registered
// buffer, compared byte for byte; Reduce sends tensor B from memory that
// was never registered (the registration cache registers it for the call)
// and the server adds it into A; Get again checks A + B element by
// element.  A destination too small for a Get is refused with a clear
// INVALID_ARGUMENT naming both sizes.  One line per operation with its
// rate; exits 1 at the first wrong byte or failed call.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <slotrpc/slotrpc.h>

#include "tensor.slotrpc.h"

namespace tensor = slotrpc::examples::tensor;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void fail(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("tensor_client: FAILED: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::exit(1);
}

// "1G", "64M", "4096": bytes, a multiple of 4 from 4 B to 16 GiB.
std::string check_size(const std::string& text, uint64_t* out) {
  if (text.empty()) return "empty size";
  uint64_t unit = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': unit = 1ull << 10; digits.pop_back(); break;
    case 'M': case 'm': unit = 1ull << 20; digits.pop_back(); break;
    case 'G': case 'g': unit = 1ull << 30; digits.pop_back(); break;
    default: break;
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 12)
    return "'" + text + "' is not a size (a whole number, optionally with K, M or G)";
  const uint64_t v = std::stoull(digits) * unit;
  if (v < 4 || v > (16ull << 30) || v % 4 != 0)
    return "--size " + text + ": allowed a multiple of 4 bytes from 4 to 16G";
  *out = v;
  return {};
}

// Exact in float32: small whole numbers, and their sums.
float a_of(uint64_t i) { return static_cast<float>(i % 1021); }
float b_of(uint64_t i) { return static_cast<float>((i * 7) % 509); }

std::unique_ptr<float[]> allocate(uint64_t elements) {
  std::unique_ptr<float[]> p(new (std::nothrow) float[elements]);
  if (!p) fail("cannot allocate %" PRIu64 " bytes", elements * 4);
  return p;
}

double mb_per_s(uint64_t bytes, Clock::time_point since) {
  const double s = std::chrono::duration<double>(Clock::now() - since).count();
  return static_cast<double>(bytes) / 1e6 / s;
}

template <class T>
slotrpc::Reply<T> check(slotrpc::Reply<T>&& reply, const char* what) {
  if (!reply.ok()) fail("%s: %s", what, reply.status().to_string().c_str());
  return std::move(reply);
}

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:7002";
  std::string size_text = "64M";
  std::string name = "weights";
  CLI::App app("Moves float32 tensors through a tensor_server (examples/tensor) as bulk payloads, "
               "Put, Get, Reduce, Get, checking every byte; exits 1 on the first wrong one.",
               "tensor_client");
  app.add_option("--connect", address, "Server address, HOST:PORT")->capture_default_str();
  app.add_option("--size", size_text, "Bytes per tensor: a multiple of 4, K/M/G suffixes (4 .. 16G)")
      ->check([](const std::string& t) {
        uint64_t v = 0;
        return check_size(t, &v);
      })
      ->capture_default_str();
  app.add_option("--name", name, "Tensor name on the server")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  uint64_t bytes = 0;
  check_size(size_text, &bytes);
  const uint64_t n = bytes / 4;

  // transport=auto (SLOTRPC_TRANSPORT): shared memory for a server on this
  // host, verbs where both ends have an RDMA device, tcp otherwise; bulk
  // payloads travel on all three (docs/design.md, "Bulk payloads").
  auto channel = slotrpc::Channel::connect(address);
  if (!channel.ok()) fail("%s", channel.status().to_string().c_str());
  slotrpc::Channel& ch = **channel;
  tensor::TensorsClient client(ch);
  std::printf("tensor_client: %" PRIu64 " bytes per tensor over %s\n", bytes,
              std::string(slotrpc::to_string(ch.transport())).c_str());

  // A and the Get destination: registered once, used by every call below.
  auto a = allocate(n);
  auto out = allocate(n);
  for (uint64_t i = 0; i < n; ++i) a[i] = a_of(i);
  auto a_region = ch.register_memory({reinterpret_cast<std::byte*>(a.get()), bytes});
  auto out_region = ch.register_memory({reinterpret_cast<std::byte*>(out.get()), bytes});
  if (!a_region.ok()) fail("register A: %s", a_region.status().to_string().c_str());
  if (!out_region.ok()) fail("register the destination: %s", out_region.status().to_string().c_str());

  auto t0 = Clock::now();
  {
    auto r = check(client.Put([&](flatbuffers::FlatBufferBuilder& fbb) {
                                return tensor::CreatePutRequestDirect(fbb, name.c_str(), n);
                              },
                              slotrpc::CallOptions().send_bulk(a_region.value(), 0, bytes))
                       .get(),
                   "Put");
    if (r->elements() != n) fail("Put stored %" PRIu64 " elements, sent %" PRIu64, r->elements(), n);
  }
  std::printf("put     %" PRIu64 " bytes  %9.1f MB/s\n", bytes, mb_per_s(bytes, t0));

  const auto get = [&](const char* what) {
    std::memset(out.get(), 0xff, bytes);  // so a missing byte shows
    const auto t = Clock::now();
    auto r = check(client.Get([&](flatbuffers::FlatBufferBuilder& fbb) {
                                return tensor::CreateGetRequestDirect(fbb, name.c_str());
                              },
                              slotrpc::CallOptions().receive_bulk(out_region.value(), 0, bytes))
                       .get(),
                   what);
    if (r->elements() != n || r.bulk_received(0) != bytes)
      fail("%s: %" PRIu64 " elements, %" PRIu64 " bytes received; expected %" PRIu64 " and %" PRIu64,
           what, r->elements(), r.bulk_received(0), n, bytes);
    std::printf("%-7s %" PRIu64 " bytes  %9.1f MB/s\n", what, bytes, mb_per_s(bytes, t));
  };
  get("get");
  if (std::memcmp(out.get(), a.get(), bytes) != 0) {
    for (uint64_t i = 0; i < n; ++i)
      if (std::memcmp(&out[i], &a[i], 4) != 0) fail("get: element %" PRIu64 " differs", i);
  }

  // B from memory never registered: the registration cache pins it for the
  // call.  It reuses A's buffer (A is no longer needed: a_of recomputes it).
  a_region.value().release();
  for (uint64_t i = 0; i < n; ++i) a[i] = b_of(i);
  t0 = Clock::now();
  {
    auto r = check(client.Reduce([&](flatbuffers::FlatBufferBuilder& fbb) {
                                   return tensor::CreateReduceRequestDirect(fbb, name.c_str(), n);
                                 },
                                 slotrpc::CallOptions().send_bulk(std::span<const std::byte>(
                                     reinterpret_cast<const std::byte*>(a.get()), bytes)))
                       .get(),
                   "Reduce");
    if (r->elements() != n) fail("Reduce added %" PRIu64 " elements, sent %" PRIu64, r->elements(), n);
  }
  std::printf("reduce  %" PRIu64 " bytes  %9.1f MB/s\n", bytes, mb_per_s(bytes, t0));
  get("get+sum");
  for (uint64_t i = 0; i < n; ++i)
    if (out[i] != a_of(i) + b_of(i))
      fail("reduce: element %" PRIu64 " is %g, expected %g", i, static_cast<double>(out[i]),
           static_cast<double>(a_of(i) + b_of(i)));

  // A destination one element short: refused by the handler, nothing written.
  if (n > 1) {
    std::memset(out.get(), 0, bytes);
    auto r = client.Get([&](flatbuffers::FlatBufferBuilder& fbb) {
                          return tensor::CreateGetRequestDirect(fbb, name.c_str());
                        },
                        slotrpc::CallOptions().receive_bulk(out_region.value(), 0, bytes - 4))
                 .get();
    if (r.status().code() != slotrpc::StatusCode::kInvalidArgument ||
        r.status().message().find(std::to_string(bytes - 4)) == std::string::npos)
      fail("a short destination: expected INVALID_ARGUMENT naming %" PRIu64 " bytes, got %s",
           bytes - 4, r.status().to_string().c_str());
    for (uint64_t i = 0; i < n; ++i)
      if (out[i] != 0.0f) fail("a refused Get wrote element %" PRIu64, i);
  }
  std::printf("tensor_client: all checks passed\n");
  return 0;
}
