// A small etcd v3 client: the calls discovery needs (range, put, delete,
// leases, watch), through etcd's JSON gateway (/v3/...) over plain HTTP.
//
// Why the gateway and not etcd's gRPC API: the library must not depend on
// gRPC (it is the benchmarks' baseline only), and discovery makes a few
// small requests a second per process, where JSON's cost does not matter.
// The gateway ships with every etcd 3.4+ server on its client port; keys
// and values travel base64-encoded, 64-bit integers as strings.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/address.h"
#include "rpc/discovery/http_client.h"
#include "slotrpc/result.h"
#include "slotrpc/status.h"

namespace slotrpc::rpc::discovery {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t lease = 0;  // the lease the key is attached to (0: none)
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision the list was read at
  std::vector<KeyValue> kvs;
};

struct WatchEvent {
  bool deleted = false;  // DELETE (a lease expired, or a delete), else PUT
  KeyValue kv;           // the value is empty for a DELETE
};

class EtcdClient {
 public:
  // `interrupt` ends every request in progress (stop()); it must outlive
  // the client.
  EtcdClient(base::Endpoint endpoint, const Interrupt& interrupt,
             std::chrono::milliseconds timeout = std::chrono::seconds(2))
      : endpoint_(std::move(endpoint)), interrupt_(interrupt), timeout_(timeout) {}

  const base::Endpoint& endpoint() const { return endpoint_; }

  // Every key under `prefix` (keys that start with it).
  Result<RangeResult> range_prefix(const std::string& prefix);
  Status put(const std::string& key, const std::string& value, int64_t lease = 0);
  Status remove(const std::string& key);
  // A lease of `ttl_seconds`; its id.
  Result<int64_t> grant(int64_t ttl_seconds);
  // Refreshes the lease; its remaining TTL, 0 when it is gone (expired or
  // revoked: the keys under it are deleted).
  Result<int64_t> keep_alive(int64_t lease);
  Status revoke(int64_t lease);
  // Watches keys under `prefix` from `start_revision` on; each batch of
  // events goes to `on_events`.  Returns when the watch ends: CANCELLED
  // once the interrupt fired, UNAVAILABLE when etcd went away or cancelled
  // the watch (a compacted revision: list again).
  Status watch_prefix(const std::string& prefix, int64_t start_revision,
                      const std::function<void(const std::vector<WatchEvent>&)>& on_events);

 private:
  Result<std::string> call(const std::string& path, const std::string& body);
  base::Endpoint endpoint_;
  const Interrupt& interrupt_;
  std::chrono::milliseconds timeout_;
};

// The end of etcd's range for "every key starting with `prefix`": the
// prefix with its last byte raised (etcd's own rule, clientv3.GetPrefixRangeEnd).
std::string prefix_range_end(const std::string& prefix);

}  // namespace slotrpc::rpc::discovery
