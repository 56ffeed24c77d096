// Where and how a kernel runs. CPU and CUDA entry points take the same
// arguments struct and this context, so their signatures are identical.
#ifndef RECPS_KERNELS_EXEC_CONTEXT_H_
#define RECPS_KERNELS_EXEC_CONTEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cpu_features.h"
#include "common/thread_pool.h"

namespace recps::kernels {

// Where kernels run. kernels/dispatch.h calls the matching twin.
enum class Device {
  kCpu = 0,   // the CPU reference, on ctx.pool
  kCuda = 1,  // the CUDA twin, on ctx.cuda_stream of GPU ctx.cuda_device
};

// "cpu", "cuda" or "cuda:N" (the --device flag of every binary);
// INVALID_ARGUMENT saying what is accepted otherwise. Sets *cuda_device to N
// (0 for "cuda", untouched for "cpu").
absl::StatusOr<Device> ParseDevice(absl::string_view text, int* cuda_device);
std::string DeviceName(Device device, int cuda_device);

struct ExecContext {
  // CPU: pool to split work over; nullptr runs on the calling thread.
  ThreadPool* pool = nullptr;
  // CPU: vector path. kAuto (the default) picks the best this CPU supports;
  // tests set each supported path in turn. All paths are bit-identical.
  CpuIsa isa = CpuIsa::kAuto;
  // CUDA: the cudaStream_t to launch on; nullptr is the default stream.
  // Launches are asynchronous: results are ready after the stream syncs.
  void* cuda_stream = nullptr;
  // CUDA: the cublasHandle_t used by GemmCuda (required there).
  void* cublas_handle = nullptr;
  // Which twin kernels/dispatch.h runs. CPU is the default.
  Device device = Device::kCpu;
  // CUDA: the GPU's ordinal (what cudaSetDevice takes).
  int cuda_device = 0;
};

// Element type of stored embedding rows.
enum class RowDType {
  kFloat32 = 0,
  kFloat16 = 1,  // IEEE half, stored as uint16_t bits; math in fp32
};

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_EXEC_CONTEXT_H_
