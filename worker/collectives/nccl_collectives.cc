#include "worker/collectives/nccl_collectives.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace recps::worker {
namespace {

absl::Status CudaStatus(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(op, ": ", cudaGetErrorName(err), ": ",
                                          cudaGetErrorString(err)));
}

// A lost or misbehaving peer is UNAVAILABLE; our own misuse is
// INVALID_ARGUMENT; the rest is INTERNAL.
absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm,
                        const std::string& op) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(op, ": ", ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&msg, " (", last, ")");
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Non-blocking communicators report progress through the async error;
// polling it lets us give up at a deadline instead of hanging forever.
absl::Status AwaitComm(ncclComm_t comm, absl::Time deadline,
                       const std::string& op) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclStatus(r, comm, op);
    if (state != ncclInProgress) return NcclStatus(state, comm, op);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(op, ": timed out (a peer is missing or stuck)"));
    }
    absl::SleepFor(absl::Microseconds(100));
  }
}

class NcclCollectives : public Collectives {
 public:
  NcclCollectives(ncclComm_t comm, cudaStream_t stream, float* scratch,
                  int rank, int world_size, int device, absl::Duration timeout)
      : comm_(comm),
        stream_(stream),
        scratch_(scratch),
        rank_(rank),
        world_size_(world_size),
        device_(device),
        timeout_(timeout) {}

  ~NcclCollectives() override {
    cudaSetDevice(device_);
    if (!comm_aborted_) {
      // Finalize flushes outstanding work; abort when that fails or hangs.
      bool clean = false;
      if (broken_.ok()) {
        const ncclResult_t r = ncclCommFinalize(comm_);
        clean = (r == ncclSuccess || r == ncclInProgress) &&
                AwaitComm(comm_, absl::Now() + timeout_, "finalize").ok();
      }
      if (clean) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    if (data.empty()) return absl::OkStatus();
    return Run("allreduce", data.data(), [&] {
      return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat,
                           ncclSum, comm_, stream_);
    });
  }

  absl::Status Broadcast(absl::Span<float> data, int root) override {
    if (root < 0 || root >= world_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Broadcast: root ", root, " out of range [0, ", world_size_, ")"));
    }
    if (data.empty()) return absl::OkStatus();
    return Run("broadcast", data.data(), [&] {
      return ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat,
                           root, comm_, stream_);
    });
  }

  absl::Status Barrier() override {
    return Run("barrier", scratch_, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_,
                           stream_);
    });
  }

 private:
  template <typename Launch>
  absl::Status Run(const char* op_name, const float* ptr, Launch&& launch) {
    absl::MutexLock lock(&mu_);
    const std::string op =
        absl::StrCat("NCCL ", op_name, " on rank ", rank_, " of ", world_size_);
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          op, ": group is broken by an earlier error: ", broken_.message()));
    }
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    cudaPointerAttributes attrs{};
    if (cudaPointerGetAttributes(&attrs, ptr) != cudaSuccess ||
        (attrs.type != cudaMemoryTypeDevice &&
         attrs.type != cudaMemoryTypeManaged)) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": buffer is not device memory"));
    }
    absl::Status status = Execute(op, std::forward<Launch>(launch));
    if (!status.ok() && !absl::IsInvalidArgument(status)) {
      // The communicator cannot be trusted after a failed or stuck op.
      broken_ = status;
      ncclCommAbort(comm_);
      comm_aborted_ = true;
    }
    return status;
  }

  template <typename Launch>
  absl::Status Execute(const std::string& op, Launch&& launch) {
    const absl::Time deadline = absl::Now() + timeout_;
    ncclResult_t r = launch();
    if (r == ncclInProgress) {
      RETURN_IF_ERROR(AwaitComm(comm_, deadline, op));
    } else if (r != ncclSuccess) {
      return NcclStatus(r, comm_, op);
    }
    // Wait for the stream, watching for a peer's failure meanwhile.
    while (true) {
      cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) return CudaStatus(err, op.c_str());
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclStatus(state, comm_, op);
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(op, ": timed out (a peer is missing or stuck)"));
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

  absl::Mutex mu_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  float* scratch_;  // 1 float on the device, for Barrier
  const int rank_;
  const int world_size_;
  const int device_;
  const absl::Duration timeout_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool comm_aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    KeyValueStore& store, const std::string& prefix, int rank, int world_size,
    int device, absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL: rank ", rank, " out of range for world size ", world_size));
  }
  if (prefix.empty()) {
    return absl::InvalidArgumentError("NCCL: empty rendezvous prefix");
  }
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));

  // Rank 0 makes the id; everyone else reads it (hex: the store holds text).
  const std::string key = absl::StrCat(prefix, "/nccl/unique_id");
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclStatus(r, nullptr, "ncclGetUniqueId");
    RETURN_IF_ERROR(store.Set(key, absl::BytesToHexString(absl::string_view(
                                       id.internal, sizeof(id)))));
  } else {
    absl::StatusOr<std::string> hex = store.Get(key, timeout);
    if (!hex.ok()) {
      return absl::Status(hex.status().code(),
                          absl::StrCat("NCCL rendezvous as rank ", rank,
                                       ": rank 0 did not publish its id: ",
                                       hex.status().message()));
    }
    const std::string bytes = absl::HexStringToBytes(*hex);
    if (bytes.size() != sizeof(id)) {
      return absl::DataLossError(absl::StrCat(
          "NCCL rendezvous: malformed unique id under '", key, "'"));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id));
  }

  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 "cudaStreamCreate"));
  float* scratch = nullptr;
  if (absl::Status s =
          CudaStatus(cudaMalloc(&scratch, sizeof(float)), "cudaMalloc");
      !s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  auto cleanup = [&] {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
  };

  // Non-blocking, so that a rank that never joins ends in a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const std::string op =
      absl::StrCat("NCCL rendezvous '", prefix, "' as rank ", rank, " of ",
                   world_size, " on device ", device);
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  absl::Status status =
      NcclStatus(r == ncclInProgress ? ncclSuccess : r, comm, op);
  if (status.ok()) status = AwaitComm(comm, deadline, op);
  if (!status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cleanup();
    return status;
  }
  return std::unique_ptr<Collectives>(new NcclCollectives(
      comm, stream, scratch, rank, world_size, device, timeout));
}

}  // namespace recps::worker
