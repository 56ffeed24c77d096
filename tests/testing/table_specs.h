// TableSpecs for store tests, in one line each.
#ifndef RECPS_TESTS_TESTING_TABLE_SPECS_H_
#define RECPS_TESTS_TESTING_TABLE_SPECS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "common/config/table_spec.h"
#include "kernels/optimizer.h"

namespace recps::testing {

// A table named `name` of width `dim`; num_rows 0 is dynamic. The default
// initialisation of config::TableSpec applies.
inline config::TableSpec TestTableSpec(
    std::string name, int dim, int64_t num_rows = 0,
    OptimizerKind kind = OptimizerKind::kSgd, float lr = 0.5f) {
  config::TableSpec s;
  s.name = std::move(name);
  s.dim = dim;
  s.num_rows = num_rows;
  s.optimizer.kind = kind;
  s.optimizer.learning_rate = lr;
  return s;
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_TABLE_SPECS_H_
