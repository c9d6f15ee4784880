// TLS of the cluster. Mutual TLS on the internal plane: a loopback cluster whose workers require
// client certificates serves requests through the router, and refuses every client that does not
// present a certificate signed by the cluster's CA (plaintext, TLS without a certificate, another
// CA's). TLS on the router's public ports (router.tls_cert_file/tls_key_file): gRPC and HTTPS
// clients that verify the certificate are served, plaintext clients are not.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "client/client.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "serving/grpc_util.h"
#include "serving/internal_tls.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/cluster/free_ports.h"

namespace icecache::testing {
namespace {

std::string FreshDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

class InternalTls : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tls = cluster::WriteThrowawayCertificates(FreshDir("icecache_tls_ca"));
    ASSERT_TRUE(tls.ok()) << tls.status().ToString();
    tls_ = *tls;
    cluster_ = LoopbackCluster::Start(::testing::TempDir() + "/icecache_tls_model", 1, 1, "tcp,sm,self", true, 0,
                                      60000, "reference", "f32",
                                      [this](cluster::ClusterConfig& c) { c.internal_tls = tls_; });
    ASSERT_NE(cluster_, nullptr);
  }

  // Stats on the decode worker over `credentials`.
  grpc::Status DecodeStats(std::shared_ptr<grpc::ChannelCredentials> credentials) {
    auto stub = v1::DecodeWorker::NewStub(
        cluster::MakeChannel(cluster_->decode[0]->address(), cluster::kDefaultMaxMessageBytes, credentials));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsRequest req;
    v1::WorkerStats out;
    return stub->Stats(&ctx, req, &out);
  }

  cluster::InternalTlsSection tls_;
  std::unique_ptr<LoopbackCluster> cluster_;
};

TEST_F(InternalTls, RouterServesThroughMutualTls) {
  router::RemoteGenerateOptions o;
  o.router = cluster_->router->address();
  o.prompt_ids = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  o.max_tokens = 6;
  o.ignore_eos = true;
  o.budget_pages = 0;  // full attention
  std::vector<int32_t> tokens;
  Status s = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
    tokens.insert(tokens.end(), c.token_ids.begin(), c.token_ids.end());
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tokens.size(), 6u);
}

TEST_F(InternalTls, MemberCertificateIsAccepted) {
  auto creds = cluster::InternalChannelCredentials(tls_);
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  grpc::Status s = DecodeStats(*creds);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(InternalTls, PlaintextClientIsRefused) {
  grpc::Status s = DecodeStats(nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(InternalTls, ClientWithoutCertificateIsRefused) {
  std::ifstream f(tls_.ca_file);
  std::string ca((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca;  // trusts the server, presents nothing
  grpc::Status s = DecodeStats(grpc::SslCredentials(o));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(InternalTls, CertificateOfAnotherCaIsRefused) {
  auto other = cluster::WriteThrowawayCertificates(FreshDir("icecache_tls_other_ca"));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  // The other CA's member trusts our CA for the server, but its own certificate is foreign.
  cluster::InternalTlsSection mixed = *other;
  mixed.ca_file = tls_.ca_file;
  auto creds = cluster::InternalChannelCredentials(mixed);
  ASSERT_TRUE(creds.ok()) << creds.status().ToString();
  grpc::Status s = DecodeStats(*creds);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // And a client that trusts only the other CA does not accept the worker.
  auto creds2 = cluster::InternalChannelCredentials(*other);
  ASSERT_TRUE(creds2.ok());
  EXPECT_EQ(DecodeStats(*creds2).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(InternalTlsConfig, PartialOrUnreadableSettingsAreClearErrors) {
  auto partial = cluster::ParseClusterConfig("internal_tls: {ca_file: /x/ca.pem}\n", "inline");
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(partial.status().message().find("ca_file, cert_file and key_file together"), std::string::npos)
      << partial.status().message();

  cluster::InternalTlsSection missing{"/nonexistent/ca.pem", "/nonexistent/cert.pem", "/nonexistent/key.pem", ""};
  auto server = cluster::InternalServerCredentials(missing);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("internal_tls.ca_file: cannot read '/nonexistent/ca.pem'"),
            std::string::npos)
      << server.status().message();

  std::string dir = FreshDir("icecache_tls_notpem");
  std::ofstream(dir + "/ca.pem") << "not a certificate";
  cluster::InternalTlsSection bad{dir + "/ca.pem", dir + "/ca.pem", dir + "/ca.pem", ""};
  auto channel = cluster::InternalChannelCredentials(bad);
  ASSERT_FALSE(channel.ok());
  EXPECT_NE(channel.status().message().find("is not a PEM file"), std::string::npos) << channel.status().message();

  // A worker whose certificate files are unreadable does not start, and says why.
  cluster::ClusterConfig c;
  c.model.dir = "/nonexistent-model";
  c.internal_tls = missing;
  EXPECT_FALSE(cluster::InternalServerCredentials(c.internal_tls).ok());
}

class PublicTls : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tls = cluster::WriteThrowawayCertificates(FreshDir("icecache_public_tls"));
    ASSERT_TRUE(tls.ok()) << tls.status().ToString();
    tls_ = *tls;
    http_port_ = FreePortRange(1, 41);
    ASSERT_GT(http_port_, 0);
    cluster_ = LoopbackCluster::Start(::testing::TempDir() + "/icecache_tls_model", 1, 1, "tcp,sm,self", true, 0,
                                      60000, "reference", "f32", [this](cluster::ClusterConfig& c) {
                                        c.router.tls_cert_file = tls_.cert_file;
                                        c.router.tls_key_file = tls_.key_file;
                                        c.router.http_port = http_port_;
                                      });
    ASSERT_NE(cluster_, nullptr);
  }

  // Generates through the router's gRPC port, verifying it against `ca_file` ("" = plaintext).
  Status Generate(const std::string& ca_file, std::vector<int32_t>* tokens) {
    router::RemoteGenerateOptions o;
    o.router = cluster_->router->address();
    o.prompt_ids = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    o.max_tokens = 6;
    o.ignore_eos = true;
    o.timeout_seconds = 20;
    o.tls_ca_file = ca_file;
    return router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
      tokens->insert(tokens->end(), c.token_ids.begin(), c.token_ids.end());
      return true;
    });
  }

  cluster::InternalTlsSection tls_;
  int http_port_ = 0;
  std::unique_ptr<LoopbackCluster> cluster_;
};

TEST_F(PublicTls, GrpcClientThatVerifiesTheCertificateIsServed) {
  std::vector<int32_t> tokens;
  Status s = Generate(tls_.ca_file, &tokens);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tokens.size(), 6u);
}

TEST_F(PublicTls, PlaintextGrpcClientIsRefused) {
  std::vector<int32_t> tokens;
  Status s = Generate("", &tokens);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_TRUE(tokens.empty());
}

TEST_F(PublicTls, GrpcClientTrustingAnotherCaIsRefused) {
  auto other = cluster::WriteThrowawayCertificates(FreshDir("icecache_public_tls_other"));
  ASSERT_TRUE(other.ok());
  std::vector<int32_t> tokens;
  EXPECT_EQ(Generate(other->ca_file, &tokens).code(), StatusCode::kUnavailable);
  EXPECT_EQ(Generate("/nonexistent/ca.pem", &tokens).code(), StatusCode::kInvalidArgument);
}

TEST_F(PublicTls, HttpsClientIsServedAndPlainHttpIsNot) {
  httplib::SSLClient https("127.0.0.1", http_port_);
  https.set_ca_cert_path(tls_.ca_file.c_str());
  https.enable_server_certificate_verification(true);
  https.set_connection_timeout(10, 0);
  https.set_read_timeout(30, 0);
  auto models = https.Get("/v1/models");
  ASSERT_TRUE(models) << httplib::to_string(models.error());
  EXPECT_EQ(models->status, 200) << models->body;
  auto done = https.Post("/v1/completions",
                         R"({"model":"icecache_tls_model","prompt":"hello there","max_tokens":4,"ignore_eos":true})",
                         "application/json");
  ASSERT_TRUE(done) << httplib::to_string(done.error());
  EXPECT_EQ(done->status, 200) << done->body;
  EXPECT_NE(done->body.find("\"completion_tokens\":4"), std::string::npos) << done->body;

  httplib::Client plain("127.0.0.1", http_port_);
  plain.set_connection_timeout(5, 0);
  plain.set_read_timeout(5, 0);
  auto refused = plain.Get("/v1/models");
  EXPECT_FALSE(refused && refused->status == 200);
}

TEST(PublicTlsConfig, PartialOrUnreadableSettingsAreClearErrors) {
  auto partial = cluster::ParseClusterConfig("router: {tls_cert_file: /x/cert.pem}\n", "inline");
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(partial.status().message().find("router.tls_cert_file and router.tls_key_file go together"),
            std::string::npos)
      << partial.status().message();
  auto creds = cluster::PublicServerCredentials("/nonexistent/cert.pem", "/nonexistent/key.pem");
  ASSERT_FALSE(creds.ok());
  EXPECT_NE(creds.status().message().find("router.tls_cert_file: cannot read '/nonexistent/cert.pem'"),
            std::string::npos)
      << creds.status().message();
}

}  // namespace
}  // namespace icecache::testing
