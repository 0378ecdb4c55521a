// The pieces of the etcd client that need no etcd (lib/rpc/discovery): the
// JSON reader on the gateway's answers and on bad input, base64, the
// prefix's range end, and etcd:// targets.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "rpc/discovery/etcd_client.h"
#include "rpc/discovery/etcd_target.h"
#include "rpc/discovery/json.h"

using namespace slotrpc::rpc::discovery;

TEST_CASE("the JSON reader takes a gateway answer") {
  auto j = parse_json(
      R"({"result":{"header":{"revision":"42"},"events":[{"type":"DELETE","kv":{"key":"L2EvYg==","mod_revision":"4"}},)"
      R"({"kv":{"key":"L2EvYw==","value":"eQ=="}}],"canceled":false,"n":-1.5e3,"s":"a\"\\\n\u00e9"}})");
  REQUIRE(j.ok());
  const Json* result = j->get("result");
  REQUIRE(result != nullptr);
  CHECK(result->get("header")->get("revision")->as_int() == 42);
  REQUIRE(result->get("events")->items.size() == 2);
  CHECK(result->get("events")->items[0].get("type")->text == "DELETE");
  CHECK(base64_decode(result->get("events")->items[1].get("kv")->get("key")->text) == "/a/c");
  CHECK(result->get("canceled")->kind == Json::Kind::kBool);
  CHECK_FALSE(result->get("canceled")->boolean);
  CHECK(result->get("n")->text == "-1.5e3");
  CHECK(result->get("s")->text == "a\"\\\n\xc3\xa9");
  CHECK(result->get("missing") == nullptr);
}

TEST_CASE("the JSON reader refuses bad input, saying where") {
  for (const char* bad : {"", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "\"open", "{} x", "{\"a\":\"\\u12\"}"}) {
    auto j = parse_json(bad);
    CHECK_MESSAGE(!j.ok(), bad);
    if (!j.ok()) CHECK(j.status().message().find("bad JSON at byte") != std::string::npos);
  }
  std::string deep(100, '[');
  CHECK(parse_json(deep).status().message().find("nested too deeply") != std::string::npos);
}

TEST_CASE("base64 round trip and the range end of a prefix") {
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", "/services/kv/127.0.0.1:7000",
                                                     std::string("\0\xff\x10", 3)})
    CHECK(base64_decode(base64_encode(s)) == s);
  CHECK(base64_encode("/a/") == "L2Ev");
  CHECK_FALSE(base64_decode("not*base64").has_value());
  CHECK(prefix_range_end("/a/") == "/a0");
  CHECK(prefix_range_end(std::string("a\xff", 2)) == "b");
  CHECK(json_quote("a\"b\\\n") == "\"a\\\"b\\\\\\u000a\"");
}

TEST_CASE("etcd targets: HOST:PORT/prefix, normalised, or a reason") {
  auto t = parse_etcd_target("127.0.0.1:2379/services/kv/");
  REQUIRE(t.ok());
  CHECK(t->endpoint.host == "127.0.0.1");
  CHECK(t->endpoint.port == 2379);
  CHECK(t->key_prefix == "/services/kv/");
  CHECK(parse_etcd_target("[::1]:2379//x").value().key_prefix == "/x/");
  CHECK(parse_etcd_target("127.0.0.1:2379").status().message().find("no /prefix") != std::string::npos);
  CHECK(parse_etcd_target("127.0.0.1:0/x").status().message().find("port is 0") != std::string::npos);
  CHECK(parse_etcd_target("127.0.0.1:2379/").status().message().find("prefix is empty") != std::string::npos);
}
