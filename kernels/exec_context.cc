#include "kernels/exec_context.h"

#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recps::kernels {

absl::StatusOr<Device> ParseDevice(absl::string_view text, int* cuda_device) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") {
    if (cuda_device != nullptr) *cuda_device = 0;
    return Device::kCuda;
  }
  int ordinal = -1;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "cuda:") && absl::SimpleAtoi(rest, &ordinal) &&
      ordinal >= 0 && ordinal < 1024) {
    if (cuda_device != nullptr) *cuda_device = ordinal;
    return Device::kCuda;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device '", text, "': expected cpu, cuda or cuda:N (N in 0..1023)"));
}

std::string DeviceName(Device device, int cuda_device) {
  return device == Device::kCuda ? absl::StrCat("cuda:", cuda_device) : "cpu";
}

namespace internal {

absl::Status NoCudaError(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(
      op, ": this build has no CUDA kernels; run with --device=cpu or build "
          "where nvcc is present"));
}

absl::Status UnknownDeviceError(const char* op, Device device) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": unknown device ", static_cast<int>(device)));
}

}  // namespace internal
}  // namespace recps::kernels
