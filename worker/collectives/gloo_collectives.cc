#include "worker/collectives/gloo_collectives.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

namespace recps::worker {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Carries a store error through Gloo (which only knows exceptions) back to
// CreateGlooCollectives with its status code intact.
struct StoreError : public gloo::IoException {
  explicit StoreError(absl::Status s)
      : gloo::IoException(std::string(s.message())), status(std::move(s)) {}
  absl::Status status;
};

// gloo::rendezvous::Store over our KeyValueStore. Gloo's keys are the rank
// numbers, so each one is put under the run's prefix.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KeyValueStore& store, std::string prefix,
                   absl::Duration timeout)
      : store_(store),
        prefix_(std::move(prefix)),
        timeout_(timeout),
        deadline_(absl::Now() + timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(Key(key), std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value =
        store_.Get(Key(key), Remaining(timeout_));
    Check(value.status(), key);
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, ToChrono(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const std::string& key : keys) full.push_back(Key(key));
    // Gloo passes kNoTimeout (0) for "use the default".
    const absl::Duration t =
        timeout.count() > 0 ? absl::Milliseconds(timeout.count()) : timeout_;
    Check(store_.Wait(full, Remaining(t)), keys.size() == 1 ? keys[0] : "");
  }

 private:
  // Gloo waits once per peer; one deadline keeps the whole rendezvous
  // within the caller's timeout.
  absl::Duration Remaining(absl::Duration t) const {
    return std::max(absl::ZeroDuration(), std::min(t, deadline_ - absl::Now()));
  }

  std::string Key(const std::string& key) const {
    return absl::StrCat(prefix_, "/gloo/", key);
  }

  // Throws StoreError; a missing numeric key means that rank never joined.
  void Check(const absl::Status& status, const std::string& key = "") const {
    if (status.ok()) return;
    std::string hint;
    if (absl::IsDeadlineExceeded(status) && !key.empty() &&
        std::all_of(key.begin(), key.end(), absl::ascii_isdigit)) {
      hint = absl::StrCat("rank ", key, " did not join within ",
                          absl::FormatDuration(timeout_), ": ");
    }
    throw StoreError(
        absl::Status(status.code(), absl::StrCat(hint, status.message())));
  }

  KeyValueStore& store_;
  const std::string prefix_;
  const absl::Duration timeout_;
  const absl::Time deadline_;
};

// Runs `fn`, turning whatever Gloo throws into a status that names `what`.
template <typename Fn>
absl::Status CatchGloo(const std::string& what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const StoreError& e) {
    return absl::Status(e.status.code(),
                        absl::StrCat(what, ": ", e.status.message()));
  } catch (const gloo::IoException& e) {
    // A peer died, closed its socket or timed out.
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::UnknownError(absl::StrCat(what, ": unknown exception"));
  }
}

class GlooCollectives : public Collectives {
 public:
  GlooCollectives(std::shared_ptr<gloo::rendezvous::Context> context,
                  std::shared_ptr<gloo::transport::Device> device,
                  absl::Duration timeout)
      : context_(std::move(context)),
        device_(std::move(device)),
        timeout_(timeout) {}

  ~GlooCollectives() override {
    // Closing can throw on a broken pair; a destructor must not.
    (void)CatchGloo("close", [&] { context_.reset(); });
  }

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    if (data.empty()) return absl::OkStatus();
    return Run("allreduce", [&](uint32_t tag) {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(
              &gloo::sum<float>));
      opts.setTag(tag);
      opts.setTimeout(ToChrono(timeout_));
      gloo::allreduce(opts);
    });
  }

  absl::Status Broadcast(absl::Span<float> data, int root) override {
    if (root < 0 || root >= world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Broadcast: root ", root, " out of range [0, ", world_size(), ")"));
    }
    if (data.empty()) return absl::OkStatus();
    return Run("broadcast", [&](uint32_t tag) {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(ToChrono(timeout_));
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    return Run("barrier", [&](uint32_t tag) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(ToChrono(timeout_));
      gloo::barrier(opts);
    });
  }

 private:
  // Gives each operation its own tag (all ranks count alike), and keeps the
  // group broken after the first failure: Gloo's pairs are then in an
  // unknown state.
  template <typename Fn>
  absl::Status Run(const char* op, Fn&& fn) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Gloo ", op, " on rank ", rank(),
          ": group is broken by an earlier error: ", broken_.message()));
    }
    const uint32_t tag = next_tag_++;
    absl::Status status = CatchGloo(
        absl::StrCat("Gloo ", op, " on rank ", rank(), " of ", world_size()),
        [&] { fn(tag); });
    if (!status.ok()) broken_ = status;
    return status;
  }

  absl::Mutex mu_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::shared_ptr<gloo::transport::Device> device_;
  const absl::Duration timeout_;
  uint32_t next_tag_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

void IgnoreSigpipeOnce() {
  static const bool done = [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> CreateGlooCollectives(
    KeyValueStore& store, const std::string& prefix, int rank, int world_size,
    const std::string& hostname, absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gloo: rank ", rank, " out of range for world size ", world_size));
  }
  if (prefix.empty()) {
    return absl::InvalidArgumentError("Gloo: empty rendezvous prefix");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("Gloo: timeout must be positive");
  }
  IgnoreSigpipeOnce();

  std::shared_ptr<gloo::transport::Device> device;
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
  GlooStoreAdapter gloo_store(store, prefix, timeout);
  absl::Status status =
      CatchGloo(absl::StrCat("Gloo rendezvous '", prefix, "' as rank ", rank,
                             " of ", world_size, " on ", hostname),
                [&] {
                  gloo::transport::tcp::attr attr;
                  attr.hostname = hostname;
                  device = gloo::transport::tcp::CreateDevice(attr);
                  // Bounds the pair connects here and every later operation.
                  context->setTimeout(ToChrono(timeout));
                  context->connectFullMesh(gloo_store, device);
                });
  if (!status.ok()) return status;
  return std::unique_ptr<Collectives>(
      new GlooCollectives(std::move(context), std::move(device), timeout));
}

}  // namespace recps::worker
