#include "serving/internal_tls.h"

#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace icecache::cluster {
namespace {

// `key`: the config key naming the file, for the message ("internal_tls.ca_file").
StatusOr<std::string> ReadPem(const std::string& key, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return InvalidArgumentError(key + ": cannot read '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  if (text.find("-----BEGIN ") == std::string::npos) {
    return InvalidArgumentError(key + ": '" + path + "' is not a PEM file");
  }
  return text;
}

struct Pems {
  std::string ca, cert, key;
};

StatusOr<Pems> ReadAll(const InternalTlsSection& tls) {
  Pems p;
  ICE_ASSIGN_OR_RETURN(p.ca, ReadPem("internal_tls.ca_file", tls.ca_file));
  ICE_ASSIGN_OR_RETURN(p.cert, ReadPem("internal_tls.cert_file", tls.cert_file));
  ICE_ASSIGN_OR_RETURN(p.key, ReadPem("internal_tls.key_file", tls.key_file));
  return p;
}

// RAII for the OpenSSL objects used below.
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

Status OpenSslError(const std::string& what) { return InternalError("generating certificates: " + what + " failed"); }

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError("extension " + value);
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1 ? Status::Ok() : OpenSslError("adding extension " + value);
}

// A certificate for `key` named `common_name`, signed by issuer_key (self-signed when issuer is null).
StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key,
                        bool ca, const std::string& san) {
  Cert cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 30L * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("icecache"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  X509* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (ca) {
    ICE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE"));
    ICE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    ICE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    ICE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature"));
    ICE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth"));
    ICE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_alt_name, san));
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0) return OpenSslError("X509_sign");
  return cert;
}

Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return InvalidArgumentError("cannot write '" + path + "'");
  chmod(path.c_str(), mode);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::fclose(f);
  return ok ? Status::Ok() : InternalError("short write to '" + path + "'");
}

std::string CertPem(X509* c) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, c);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

std::string KeyPem(EVP_PKEY* k) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, k, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

}  // namespace

StatusOr<std::shared_ptr<grpc::ServerCredentials>> InternalServerCredentials(const InternalTlsSection& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  ICE_ASSIGN_OR_RETURN(Pems p, ReadAll(tls));
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = p.ca;
  o.pem_key_cert_pairs.push_back({p.key, p.cert});
  return grpc::SslServerCredentials(o);
}

StatusOr<std::shared_ptr<grpc::ChannelCredentials>> InternalChannelCredentials(const InternalTlsSection& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  ICE_ASSIGN_OR_RETURN(Pems p, ReadAll(tls));
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = p.ca;
  o.pem_private_key = p.key;
  o.pem_cert_chain = p.cert;
  return grpc::SslCredentials(o);
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(const std::string& cert_file,
                                                                          const std::string& key_file) {
  ICE_ASSIGN_OR_RETURN(std::string cert, ReadPem("router.tls_cert_file", cert_file));
  ICE_ASSIGN_OR_RETURN(std::string key, ReadPem("router.tls_key_file", key_file));
  grpc::SslServerCredentialsOptions o(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  o.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(o);
}

StatusOr<InternalTlsSection> WriteThrowawayCertificates(const std::string& dir, const std::string& server_name) {
  Key ca_key(EVP_EC_gen("P-256"));
  Key leaf_key(EVP_EC_gen("P-256"));
  if (!ca_key || !leaf_key) return OpenSslError("EVP_EC_gen");
  ICE_ASSIGN_OR_RETURN(Cert ca, MakeCert(ca_key.get(), "icecache throwaway CA", nullptr, nullptr, true, ""));
  std::string san = "IP:127.0.0.1,IP:::1,DNS:localhost";
  if (!server_name.empty()) san += ",DNS:" + server_name;
  ICE_ASSIGN_OR_RETURN(Cert leaf, MakeCert(leaf_key.get(), "icecache cluster member", ca.get(), ca_key.get(), false,
                                           san));
  InternalTlsSection out;
  out.ca_file = dir + "/ca.pem";
  out.cert_file = dir + "/cert.pem";
  out.key_file = dir + "/key.pem";
  out.server_name = server_name;
  ICE_RETURN_IF_ERROR(WriteFile(out.ca_file, CertPem(ca.get()), 0644));
  ICE_RETURN_IF_ERROR(WriteFile(out.cert_file, CertPem(leaf.get()), 0644));
  ICE_RETURN_IF_ERROR(WriteFile(out.key_file, KeyPem(leaf_key.get()), 0600));
  return out;
}

}  // namespace icecache::cluster
