// serving/grpc_util's StartServer: one port, one server. gRPC turns SO_REUSEPORT on by default,
// under which a second server on a port already served starts without an error and the kernel
// splits connections between them; StartServer turns it off, so the second one is refused.
#include <gtest/gtest.h>

#include <string>

#include "client/client.h"
#include "serving/grpc_util.h"

namespace icecache::cluster {
namespace {

TEST(StartServer, ASecondServerOnAServedPortIsRefused) {
  int port = 0;
  auto first = StartServer("127.0.0.1:0", {}, {}, &port);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto second = StartServer(address, {}, {}, nullptr);
  ASSERT_FALSE(second.ok()) << "a second server started on " << address;
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot listen on " + address), std::string::npos)
      << second.status().ToString();
  // The first one still answers its health check.
  const Status health = router::CheckHealth(address, "", 5);
  EXPECT_TRUE(health.ok()) << health.ToString();
  (*first)->Shutdown();
  // Once it is gone the port can be served again.
  auto third = StartServer(address, {}, {}, nullptr);
  EXPECT_TRUE(third.ok()) << third.status().ToString();
  if (third.ok()) (*third)->Shutdown();
}

}  // namespace
}  // namespace icecache::cluster
