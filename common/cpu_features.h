// Which vector instruction set the CPU kernels run with.
//
// Kernels are compiled once per ISA and one is picked at run time, so one
// binary runs fast on a new CPU and correctly on an old one. Every path gives
// bit-identical results (the kernels are built without FMA contraction), and
// tests run each path this machine supports.
#ifndef RECPS_COMMON_CPU_FEATURES_H_
#define RECPS_COMMON_CPU_FEATURES_H_

#include <vector>

namespace recps {

enum class CpuIsa {
  kAuto = 0,      // the best path this CPU supports
  kPortable = 1,  // plain C++ (x86-64 baseline / any architecture)
  kAvx2 = 2,      // AVX2 + FMA + F16C (Haswell, Zen 1 and later)
  kAvx512 = 3,    // AVX-512 F/BW/VL/DQ (Skylake-SP, Zen 4 and later)
};

// Name for logs and benchmark labels: "portable", "avx2", "avx512", "auto".
const char* CpuIsaName(CpuIsa isa);

// Whether this CPU (and this build) can run `isa`. kAuto and kPortable: true.
bool CpuIsaSupported(CpuIsa isa);

// The best supported path.
CpuIsa BestCpuIsa();

// `isa` itself, or the best supported path for kAuto or an unsupported one.
CpuIsa ResolveCpuIsa(CpuIsa isa);

// Every concrete path this CPU supports, portable first.
std::vector<CpuIsa> SupportedCpuIsas();

}  // namespace recps

#endif  // RECPS_COMMON_CPU_FEATURES_H_
