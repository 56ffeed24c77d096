#include "common/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace recps {

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kPortable:
      return "portable";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

#if defined(__x86_64__) && defined(RECPS_HAVE_X86_KERNELS)
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
// not know "f16c". Asked once: CPUID traps to the hypervisor in a VM (~10 us
// here), and a kernel called with an explicit ISA resolves it per call.
bool HasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}
}  // namespace
#endif

bool CpuIsaSupported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      return true;
#if defined(__x86_64__) && defined(RECPS_HAVE_X86_KERNELS)
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             HasF16c();
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
#endif
    default:
      return false;
  }
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = [] {
    if (CpuIsaSupported(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (CpuIsaSupported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kPortable;
  }();
  return best;
}

CpuIsa ResolveCpuIsa(CpuIsa isa) {
  if (isa == CpuIsa::kAuto || !CpuIsaSupported(isa)) return BestCpuIsa();
  return isa;
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuIsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

}  // namespace recps
