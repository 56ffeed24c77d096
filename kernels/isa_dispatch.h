// Run-time choice between the per-ISA builds of a CPU kernel.
//
// A source added with recps_add_isa_variants (cmake/RecpsIsa.cmake) is
// compiled once per ISA with RECPS_ISA_NS set to isa_portable, isa_avx2 or
// isa_avx512, and defines its functions inside
// `namespace recps::kernels::RECPS_ISA_NS`. The caller declares them with
// RECPS_DECLARE_ISA_VARIANTS and picks one with RecpsIsaSelect.
#ifndef RECPS_KERNELS_ISA_DISPATCH_H_
#define RECPS_KERNELS_ISA_DISPATCH_H_

#include "common/cpu_features.h"

#if defined(RECPS_HAVE_X86_KERNELS)
#define RECPS_DECLARE_ISA_VARIANTS(decl) \
  namespace isa_portable {               \
  decl;                                  \
  }                                      \
  namespace isa_avx2 {                   \
  decl;                                  \
  }                                      \
  namespace isa_avx512 {                 \
  decl;                                  \
  }
// The function `name` of the ISA that `isa` resolves to on this CPU.
#define RECPS_ISA_SELECT(isa, name)                            \
  (::recps::ResolveCpuIsa(isa) == ::recps::CpuIsa::kAvx512     \
       ? &isa_avx512::name                                     \
       : ::recps::ResolveCpuIsa(isa) == ::recps::CpuIsa::kAvx2 \
             ? &isa_avx2::name                                 \
             : &isa_portable::name)
#else
#define RECPS_DECLARE_ISA_VARIANTS(decl) \
  namespace isa_portable {               \
  decl;                                  \
  }
#define RECPS_ISA_SELECT(isa, name) (&isa_portable::name)
#endif

#endif  // RECPS_KERNELS_ISA_DISPATCH_H_
