// Throwaway certificates for the TLS tests, made with OpenSSL's C API in a
// fresh temporary directory (nothing committed, no openssl CLI):
//   ca            the CA servers and clients trust
//   server        CN=slotrpc-test-server, SANs DNS:localhost, IP:127.0.0.1
//   client        CN=client-1,O=slotrpc tests, SANs DNS:client-1.example,
//                 URI:spiffe://slotrpc.test/client-1
//   expired       a client certificate of `ca` that expired yesterday
//   other_ca      a second CA, and other_client / other_server signed by it
// P-256 keys: quick to make.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tls_test {

struct KeyPair {
  std::string cert;  // PEM file paths
  std::string key;
};

struct Pki {
  std::filesystem::path dir;
  std::string ca;        // CA certificate (PEM)
  std::string other_ca;
  KeyPair server, client, expired, other_client, other_server;
  ~Pki() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

namespace detail {

struct Issued {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  ~Issued() {
    EVP_PKEY_free(key);
    X509_free(cert);
  }
};

inline void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) throw std::runtime_error("X509V3_EXT_conf_nid " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `subject` ("CN=x" or "CN=x,O=y"), signed by `issuer`
// (itself when null), valid from `from_s` to `to_s` seconds from now.
inline void issue(Issued& out, const std::vector<std::pair<std::string, std::string>>& subject,
                  const Issued* issuer, bool ca, const std::string& sans, long from_s, long to_s) {
  static long serial = 1;
  out.key = EVP_EC_gen("P-256");
  out.cert = X509_new();
  X509_set_version(out.cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(out.cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(out.cert), from_s);
  X509_gmtime_adj(X509_getm_notAfter(out.cert), to_s);
  X509_set_pubkey(out.cert, out.key);
  X509_NAME* name = X509_get_subject_name(out.cert);
  for (const auto& [field, value] : subject)
    X509_NAME_add_entry_by_txt(name, field.c_str(), MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer->cert : out.cert;
  X509_set_issuer_name(out.cert, X509_get_subject_name(signer));
  if (ca) {
    add_ext(out.cert, signer, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(out.cert, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
    add_ext(out.cert, signer, NID_subject_key_identifier, "hash");
  } else {
    add_ext(out.cert, signer, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(out.cert, signer, NID_key_usage, "critical,digitalSignature");
    add_ext(out.cert, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (!sans.empty()) add_ext(out.cert, signer, NID_subject_alt_name, sans);
  }
  X509_sign(out.cert, issuer != nullptr ? issuer->key : out.key, EVP_sha256());
}

inline std::string write_cert(const std::filesystem::path& path, X509* cert) {
  FILE* f = std::fopen(path.c_str(), "w");
  PEM_write_X509(f, cert);
  std::fclose(f);
  return path.string();
}

inline std::string write_key(const std::filesystem::path& path, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  return path.string();
}

inline KeyPair write_pair(const std::filesystem::path& dir, const std::string& name, const Issued& i) {
  return {write_cert(dir / (name + ".crt"), i.cert), write_key(dir / (name + ".key"), i.key)};
}

}  // namespace detail

inline void make_pki(Pki& p) {
  using detail::Issued;
  char tmpl[] = "/tmp/slotrpc-tls-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
  p.dir = tmpl;
  constexpr long kDay = 24 * 3600;
  Issued ca, other_ca, server, client, expired, other_client, other_server;
  detail::issue(ca, {{"CN", "slotrpc test CA"}}, nullptr, true, "", -kDay, 30 * kDay);
  detail::issue(other_ca, {{"CN", "another CA"}}, nullptr, true, "", -kDay, 30 * kDay);
  detail::issue(server, {{"CN", "slotrpc-test-server"}}, &ca, false, "DNS:localhost,IP:127.0.0.1", -kDay, 30 * kDay);
  detail::issue(client, {{"CN", "client-1"}, {"O", "slotrpc tests"}}, &ca, false,
                "DNS:client-1.example,URI:spiffe://slotrpc.test/client-1", -kDay, 30 * kDay);
  detail::issue(expired, {{"CN", "expired-client"}}, &ca, false, "DNS:expired.example", -10 * kDay, -kDay);
  detail::issue(other_client, {{"CN", "stranger"}}, &other_ca, false, "DNS:stranger.example", -kDay, 30 * kDay);
  detail::issue(other_server, {{"CN", "slotrpc-test-server-2"}}, &other_ca, false, "DNS:localhost,IP:127.0.0.1",
                -kDay, 30 * kDay);
  p.ca = detail::write_cert(p.dir / "ca.crt", ca.cert);
  p.other_ca = detail::write_cert(p.dir / "other-ca.crt", other_ca.cert);
  p.server = detail::write_pair(p.dir, "server", server);
  p.client = detail::write_pair(p.dir, "client", client);
  p.expired = detail::write_pair(p.dir, "expired", expired);
  p.other_client = detail::write_pair(p.dir, "other-client", other_client);
  p.other_server = detail::write_pair(p.dir, "other-server", other_server);
}

}  // namespace tls_test
