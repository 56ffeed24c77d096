// The dense model and its optimizer as a checkpoint's DenseState
// (proto/recps/v1/checkpoint.proto): saved by rank 0 at a cut, loaded by
// every worker on resume. Bit-exact both ways: floats travel as their
// little-endian bytes.
#ifndef RECPS_WORKER_MODEL_DENSE_STATE_H_
#define RECPS_WORKER_MODEL_DENSE_STATE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recps/v1/checkpoint.pb.h"
#include "worker/model/dense_optimizer.h"
#include "worker/model/dlrm.h"

namespace recps::worker {

// Format of what SaveDenseState writes; LoadDenseState refuses newer ones.
inline constexpr uint32_t kDenseStateFormatVersion = 1;

// Copies the parameters and optimizer state to the host first (a GPU
// model: waits for queued work; a failed copy is its error).
absl::StatusOr<v1::DenseState> SaveDenseState(const DlrmModel& model,
                                              const DenseOptimizer& optimizer);

// Overwrites the parameters, optimizer state and step counter. The
// checkpoint's shape (num_dense, num_sparse, dim, the MLP widths) and
// optimizer kind must be this model's: FAILED_PRECONDITION naming the field
// with both values otherwise (the job changed since the save);
// INVALID_ARGUMENT for byte counts that do not match. Nothing is changed on
// error.
absl::Status LoadDenseState(const v1::DenseState& state, DlrmModel* model,
                            DenseOptimizer* optimizer);

}  // namespace recps::worker

#endif  // RECPS_WORKER_MODEL_DENSE_STATE_H_
