#include "rpc/discovery/etcd_client.h"

#include <fmt/format.h>

#include "rpc/discovery/json.h"

namespace slotrpc::rpc::discovery {

std::string prefix_range_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xFF) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

std::string b64q(const std::string& s) { return json_quote(base64_encode(s)); }

bool read_kv(const Json& j, KeyValue& out) {
  const Json* k = j.get("key");
  if (k == nullptr) return false;
  auto key = base64_decode(k->text);
  if (!key) return false;
  out.key = std::move(*key);
  if (const Json* v = j.get("value"); v != nullptr) {
    auto value = base64_decode(v->text);
    if (!value) return false;
    out.value = std::move(*value);
  }
  if (const Json* l = j.get("lease"); l != nullptr) out.lease = l->as_int().value_or(0);
  return true;
}

Status bad_answer(const std::string& what, const std::string& text) {
  return Status(StatusCode::kUnavailable,
                fmt::format("etcd's {} answer is not what the v3 gateway sends: {}", what, text.substr(0, 200)));
}

}  // namespace

Result<std::string> EtcdClient::call(const std::string& path, const std::string& body) {
  auto r = http_post(endpoint_, path, body, timeout_, interrupt_);
  if (!r.ok()) {
    return Status(r.status().code(), fmt::format("etcd at {}:{}: {}", endpoint_.host, endpoint_.port,
                                                 r.status().message()));
  }
  return r;
}

Result<RangeResult> EtcdClient::range_prefix(const std::string& prefix) {
  auto r = call("/v3/kv/range",
                fmt::format("{{\"key\":{},\"range_end\":{}}}", b64q(prefix), b64q(prefix_range_end(prefix))));
  if (!r.ok()) return r.status();
  auto j = parse_json(r.value());
  if (!j.ok()) return bad_answer("range", r.value());
  RangeResult out;
  const Json* header = j->get("header");
  const Json* rev = header != nullptr ? header->get("revision") : nullptr;
  if (rev == nullptr || !rev->as_int()) return bad_answer("range", r.value());
  out.revision = *rev->as_int();
  if (const Json* kvs = j->get("kvs"); kvs != nullptr) {
    for (const Json& kv : kvs->items) {
      KeyValue one;
      if (!read_kv(kv, one)) return bad_answer("range", r.value());
      out.kvs.push_back(std::move(one));
    }
  }
  return out;
}

Status EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  std::string body = fmt::format("{{\"key\":{},\"value\":{}", b64q(key), b64q(value));
  if (lease != 0) body += fmt::format(",\"lease\":\"{}\"", lease);
  body += "}";
  auto r = call("/v3/kv/put", body);
  return r.ok() ? Status() : r.status();
}

Status EtcdClient::remove(const std::string& key) {
  auto r = call("/v3/kv/deleterange", fmt::format("{{\"key\":{}}}", b64q(key)));
  return r.ok() ? Status() : r.status();
}

Result<int64_t> EtcdClient::grant(int64_t ttl_seconds) {
  auto r = call("/v3/lease/grant", fmt::format("{{\"TTL\":\"{}\"}}", ttl_seconds));
  if (!r.ok()) return r.status();
  auto j = parse_json(r.value());
  const Json* id = j.ok() ? j->get("ID") : nullptr;
  if (id == nullptr || !id->as_int()) return bad_answer("lease grant", r.value());
  return *id->as_int();
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease) {
  // The gateway's keepalive is a stream of one answer per request sent;
  // one request, one answer: {"result":{"ID":..,"TTL":..}}, no TTL once
  // the lease is gone.
  auto r = call("/v3/lease/keepalive", fmt::format("{{\"ID\":\"{}\"}}", lease));
  if (!r.ok()) return r.status();
  std::string_view text = r.value();
  if (auto nl = text.find('\n'); nl != std::string_view::npos) text = text.substr(0, nl);
  auto j = parse_json(text);
  const Json* result = j.ok() ? j->get("result") : nullptr;
  if (result == nullptr) return bad_answer("lease keepalive", r.value());
  const Json* ttl = result->get("TTL");
  if (ttl == nullptr) return int64_t{0};
  return ttl->as_int().value_or(0);
}

Status EtcdClient::revoke(int64_t lease) {
  auto r = call("/v3/lease/revoke", fmt::format("{{\"ID\":\"{}\"}}", lease));
  return r.ok() ? Status() : r.status();
}

Status EtcdClient::watch_prefix(const std::string& prefix, int64_t start_revision,
                                const std::function<void(const std::vector<WatchEvent>&)>& on_events) {
  const std::string body =
      fmt::format("{{\"create_request\":{{\"key\":{},\"range_end\":{},\"start_revision\":\"{}\"}}}}",
                  b64q(prefix), b64q(prefix_range_end(prefix)), start_revision);
  Status why;
  Status st = http_post_lines(endpoint_, "/v3/watch", body, timeout_, interrupt_, [&](std::string_view line) {
    auto j = parse_json(line);
    const Json* result = j.ok() ? j->get("result") : nullptr;
    if (result == nullptr) {
      why = bad_answer("watch", std::string(line));
      return false;
    }
    if (const Json* c = result->get("canceled"); c != nullptr && c->boolean) {
      const Json* reason = result->get("cancel_reason");
      why = Status(StatusCode::kUnavailable,
                   fmt::format("etcd cancelled the watch: {}", reason != nullptr ? reason->text : "no reason"));
      return false;
    }
    const Json* events = result->get("events");
    if (events == nullptr) return true;  // "created", or progress
    std::vector<WatchEvent> out;
    for (const Json& e : events->items) {
      WatchEvent ev;
      const Json* type = e.get("type");
      ev.deleted = type != nullptr && type->text == "DELETE";
      const Json* kv = e.get("kv");
      if (kv == nullptr || !read_kv(*kv, ev.kv)) {
        why = bad_answer("watch", std::string(line));
        return false;
      }
      out.push_back(std::move(ev));
    }
    on_events(out);
    return true;
  });
  if (!why.ok()) return why;
  if (!st.ok()) {
    return Status(st.code(), fmt::format("etcd watch at {}:{}: {}", endpoint_.host, endpoint_.port, st.message()));
  }
  return Status(StatusCode::kUnavailable, "etcd ended the watch");
}

}  // namespace slotrpc::rpc::discovery
