// A coordinator (domain class, gRPC service and ticker) serving on loopback
// inside the test process, for tests of its clients; restartable on the same
// port and state directory. Header-only: tests that use it link
// recps_coordinator.
#ifndef RECPS_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_
#define RECPS_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/coordinator_store.h"

namespace recps::testing {

// A coordinator serving on 127.0.0.1:`port` (0: the OS picks) with its
// state in `state_dir`; stops (like SIGTERM) when destroyed.
class InProcessCoordinator {
 public:
  static std::unique_ptr<InProcessCoordinator> Start(
      const std::string& state_dir, int port = 0,
      server::CoordinatorOptions options = server::CoordinatorOptions()) {
    auto c = std::unique_ptr<InProcessCoordinator>(new InProcessCoordinator());
    auto store = server::CoordinatorStore::Open(state_dir);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    auto coordinator =
        server::Coordinator::Create(*std::move(store), std::move(options), nullptr);
    EXPECT_TRUE(coordinator.ok()) << coordinator.status();
    if (!coordinator.ok()) return nullptr;
    c->coordinator_ = *std::move(coordinator);
    c->service_ = std::make_unique<server::CoordinatorService>(c->coordinator_.get(), nullptr);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port),
                             rpc::ServerCredentials(rpc::TransportSecurity()), &c->port_);
    builder.RegisterService(c->service_.get());
    c->server_ = builder.BuildAndStart();
    EXPECT_NE(c->port_, 0);
    if (c->server_ == nullptr || c->port_ == 0) return nullptr;
    c->ticker_ = std::make_unique<server::CoordinatorTicker>(c->coordinator_.get(),
                                                             absl::Milliseconds(10));
    return c;
  }

  ~InProcessCoordinator() {
    ticker_.reset();
    service_->Stop();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  server::Coordinator& coordinator() { return *coordinator_; }

 private:
  InProcessCoordinator() = default;
  std::unique_ptr<server::Coordinator> coordinator_;
  std::unique_ptr<server::CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<server::CoordinatorTicker> ticker_;
  int port_ = 0;
};

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_IN_PROCESS_COORDINATOR_H_
