// common/row_init.h's uniform columns, built once per ISA (cmake/RecpsIsa.cmake):
// with AVX-512DQ the 64-bit mixing vectorises over the row.
#include "common/row_init.h"

namespace recps::kernels::RECPS_ISA_NS {

void UniformRow(float a, float span, uint64_t row_key, int first, int dim, float* out) {
  row_init_internal::UniformColumns(a, span, row_key, first, dim, out);
}

}  // namespace recps::kernels::RECPS_ISA_NS
