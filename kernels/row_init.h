// Initial rows at the CPU's speed: common/row_init.h's InitRow, with the
// uniform distribution's loop (the default, and the one rows are created
// with on first touch, inside the step) compiled once per ISA and picked at
// run time. Bit-identical to InitRow on every CPU (the same formula and
// roundings; tests/kernels/row_init_test.cc).
#ifndef RECPS_KERNELS_ROW_INIT_H_
#define RECPS_KERNELS_ROW_INIT_H_

#include <cstdint>

#include "common/cpu_features.h"
#include "common/row_init.h"

namespace recps::kernels {

// As recps::InitRow; `isa` as in ExecContext (kAuto: the best this CPU has).
void InitRow(const RowInit& init, uint64_t seed, uint64_t table_key, int64_t id, int dim,
             float* out, CpuIsa isa = CpuIsa::kAuto);

}  // namespace recps::kernels

#endif  // RECPS_KERNELS_ROW_INIT_H_
