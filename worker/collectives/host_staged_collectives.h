// Gloo for GPU workers when NCCL cannot be used (a build without NCCL, NCCL's
// set-up failing, or --gpu_allreduce=gloo): each call copies the device
// buffer to a host buffer, runs the inner (host) collectives on it and copies
// the result back. One device-to-host and one host-to-device copy of the
// buffer per call; the host buffer is reused (it only grows). Slower than
// NCCL by those copies, but a GPU job still trains.
#ifndef RECPS_WORKER_COLLECTIVES_HOST_STAGED_COLLECTIVES_H_
#define RECPS_WORKER_COLLECTIVES_HOST_STAGED_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/device_memory.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/kv_store.h"

namespace recps::worker {

class HostStagedCollectives : public Collectives {
 public:
  // `inner` works on host memory (Gloo); `exec` is the device the buffers
  // live on and the stream the copies run on (kCpu: plain copies, the CPU
  // twin the tests run).
  HostStagedCollectives(std::unique_ptr<Collectives> inner,
                        std::unique_ptr<kernels::ExecResources> exec);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  // `data` is device memory of `exec`'s device.
  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Broadcast(absl::Span<float> data, int root) override;
  absl::Status Barrier() override { return inner_->Barrier(); }

  // Floats copied each way so far (what a step costs in copies).
  int64_t staged_floats() const { return staged_floats_; }

 private:
  // Copies `data` into host_ and waits for the copy.
  absl::Status ToHost(absl::Span<const float> data);
  absl::Status FromHost(absl::Span<float> data);

  std::unique_ptr<Collectives> inner_;
  std::unique_ptr<kernels::ExecResources> exec_;
  std::vector<float> host_;
  int64_t staged_floats_ = 0;
};

// A GPU worker's allreduce on CUDA device `cuda_device`, by `mode`
// (--gpu_allreduce): "nccl" (NCCL on device pointers, its error if it
// cannot be set up), "gloo" (HostStagedCollectives over Gloo, bound to
// `hostname`), or "auto" (NCCL, else Gloo through host memory with a
// warning). Every rank of a build without NCCL falls back alike; a rank
// whose NCCL set-up fails (its peers' fails too, at the rendezvous timeout)
// falls back under a prefix of its own, so Gloo never meets NCCL's keys.
// INVALID_ARGUMENT for another mode.
absl::StatusOr<std::unique_ptr<Collectives>> CreateGpuCollectives(
    KeyValueStore& store, const std::string& prefix, int rank, int world_size,
    int cuda_device, const std::string& hostname, const std::string& mode,
    absl::Duration timeout);

}  // namespace recps::worker

#endif  // RECPS_WORKER_COLLECTIVES_HOST_STAGED_COLLECTIVES_H_
