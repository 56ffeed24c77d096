#include "worker/collectives/host_staged_collectives.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/collectives/gloo_collectives.h"
#include "worker/collectives/nccl_collectives.h"

namespace recps::worker {

HostStagedCollectives::HostStagedCollectives(std::unique_ptr<Collectives> inner,
                                             std::unique_ptr<kernels::ExecResources> exec)
    : inner_(std::move(inner)), exec_(std::move(exec)) {}

absl::Status HostStagedCollectives::ToHost(absl::Span<const float> data) {
  if (host_.size() < data.size()) host_.resize(data.size());
  RETURN_IF_ERROR(kernels::CopyToHost(host_.data(), data.data(), data.size(), exec_->ctx()));
  RETURN_IF_ERROR(kernels::Synchronize(exec_->ctx()));
  staged_floats_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status HostStagedCollectives::FromHost(absl::Span<float> data) {
  RETURN_IF_ERROR(kernels::CopyToDevice(data.data(), host_.data(), data.size(), exec_->ctx()));
  // The caller may free or reuse the buffer as soon as the call returns.
  return kernels::Synchronize(exec_->ctx());
}

absl::Status HostStagedCollectives::AllReduceSum(absl::Span<float> data) {
  if (data.empty()) return inner_->AllReduceSum(data);
  RETURN_IF_ERROR(ToHost(data));
  RETURN_IF_ERROR(inner_->AllReduceSum(absl::MakeSpan(host_.data(), data.size())));
  return FromHost(data);
}

absl::Status HostStagedCollectives::Broadcast(absl::Span<float> data, int root) {
  if (data.empty()) return inner_->Broadcast(data, root);
  RETURN_IF_ERROR(ToHost(data));
  RETURN_IF_ERROR(inner_->Broadcast(absl::MakeSpan(host_.data(), data.size()), root));
  return FromHost(data);
}

absl::StatusOr<std::unique_ptr<Collectives>> CreateGpuCollectives(
    KeyValueStore& store, const std::string& prefix, int rank, int world_size,
    int cuda_device, const std::string& hostname, const std::string& mode,
    absl::Duration timeout) {
  if (mode != "auto" && mode != "nccl" && mode != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_allreduce=", mode, ": expected auto, nccl or gloo"));
  }
  if (mode != "gloo") {
    absl::StatusOr<std::unique_ptr<Collectives>> nccl =
        CreateNcclCollectives(store, prefix, rank, world_size, cuda_device, timeout);
    if (nccl.ok() || mode == "nccl") return nccl;
    LogWarning("NCCL allreduce unavailable (", nccl.status().ToString(),
               "): falling back to Gloo through host memory (each step copies the dense "
               "gradients to the host and back)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::ExecResources> exec,
                   kernels::ExecResources::Create(kernels::Device::kCuda, cuda_device,
                                                  /*pool=*/nullptr));
  ASSIGN_OR_RETURN(std::unique_ptr<Collectives> gloo,
                   CreateGlooCollectives(store, prefix + "/gloo-staged", rank, world_size,
                                         hostname, timeout));
  return std::make_unique<HostStagedCollectives>(std::move(gloo), std::move(exec));
}

}  // namespace recps::worker
