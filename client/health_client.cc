#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "serving/grpc_util.h"
#include "client/client.h"

namespace icecache::router {

// grpc.health.v1 has no generated C++ code in Debian's packages; the messages are tiny and are
// encoded here by hand (HealthCheckRequest{service = 1: string}, response {status = 1: enum}).
Status CheckHealth(const std::string& address, const std::string& service, double timeout_seconds) {
  auto channel = cluster::MakeChannel(address);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                          std::chrono::duration<double>(timeout_seconds)));
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));  // services names are < 128 bytes
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer req_buf(&slice, 1);
  grpc::ByteBuffer resp_buf;
  grpc::Status status;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req_buf, &resp_buf,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  if (!status.ok()) return cluster::FromGrpc(status).WithContext("health check of " + address);
  std::vector<grpc::Slice> slices;
  resp_buf.Dump(&slices);
  std::string body;
  for (auto& s : slices) body.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // SERVING = 1: bytes 08 01.
  if (body.size() >= 2 && body[0] == 0x08 && body[1] == 0x01) return Status::Ok();
  return UnavailableError(address + " is not serving" + (service.empty() ? "" : " " + service));
}

}  // namespace icecache::router
