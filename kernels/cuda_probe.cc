// The parts of kernels/cuda_util.h that need no CUDA headers: device-file
// detection in every build, and the CUDA-less answers where the build has
// no CUDA (cuda_util.cu has the others).
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_util.h"

namespace recps::kernels {

bool NvidiaDeviceFilesPresent() {
  for (int n = 0; n < 16; ++n) {
    const std::string path = absl::StrCat("/dev/nvidia", n);
    if (access(path.c_str(), F_OK) == 0) return true;
  }
  return false;
}

#if !defined(RECPS_HAVE_CUDA)
// A build without CUDA uses no GPU, installed or not.
absl::StatusOr<int> CudaDeviceCount() { return 0; }

absl::Status CheckCudaDevice(int device) {
  return absl::FailedPreconditionError(absl::StrCat(
      "device cuda:", device,
      ": this build has no CUDA (nvcc was not found at configure time); run "
      "with --device=cpu or rebuild with CUDA"));
}
#endif

}  // namespace recps::kernels
