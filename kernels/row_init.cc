#include "kernels/row_init.h"

#include "kernels/isa_dispatch.h"

namespace recps::kernels {

RECPS_DECLARE_ISA_VARIANTS(void UniformRow(float a, float span, uint64_t row_key, int first,
                                           int dim, float* out))

void InitRow(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id, int dim,
             float* out, CpuIsa isa) {
  if (init.distribution != RowInit::Distribution::kUniform) {
    recps::InitRow(init, seed, table_key, id, dim, out);
    return;
  }
  // Resolved once per process for kAuto (the common case: the store).
  static const auto best = RECPS_ISA_SELECT(CpuIsa::kAuto, UniformRow);
  const auto uniform = isa == CpuIsa::kAuto ? best : RECPS_ISA_SELECT(isa, UniformRow);
  uniform(init.a, init.b - init.a, row_init_internal::RowKey(init, seed, table_key, id),
          init.column_offset, dim, out);
}

}  // namespace recps::kernels
