#include "worker/model/dense_state.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace recps::worker {
namespace {

static_assert(sizeof(float) == 4, "float32 expected");

// Little-endian hosts only (as the wire format): the bytes are the floats.
std::string FloatBytes(absl::Span<const float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

absl::Status CheckInt(const char* field, int64_t saved, int64_t model) {
  if (saved == model) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "dense state: ", field, " is ", saved, " in the checkpoint but ", model,
      " in this job's model (the job's model changed since the checkpoint)"));
}

absl::Status CheckWidths(const char* field,
                         const google::protobuf::RepeatedField<int32_t>& saved,
                         const std::vector<int>& model) {
  if (saved.size() == static_cast<int>(model.size()) &&
      std::equal(saved.begin(), saved.end(), model.begin())) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "dense state: ", field, " is [", absl::StrJoin(saved, ","),
      "] in the checkpoint but [", absl::StrJoin(model, ","),
      "] in this job's model (the job's model changed since the checkpoint)"));
}

absl::Status CheckBytes(const char* field, size_t bytes, size_t floats) {
  if (bytes == floats * sizeof(float)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "dense state: ", field, " has ", bytes, " bytes; the model needs ",
      floats * sizeof(float), " (", floats, " float32)"));
}

}  // namespace

absl::StatusOr<v1::DenseState> SaveDenseState(const DlrmModel& model,
                                              const DenseOptimizer& optimizer) {
  std::vector<float> parameters, optimizer_state;
  RETURN_IF_ERROR(model.ReadParameters(&parameters));
  RETURN_IF_ERROR(optimizer.ReadState(&optimizer_state));
  v1::DenseState s;
  const DlrmConfig& c = model.config();
  s.set_format_version(kDenseStateFormatVersion);
  s.set_num_dense(c.num_dense);
  s.set_num_sparse(c.num_sparse);
  s.set_dim(c.embedding_dim);
  for (int w : c.bottom_mlp) s.add_bottom_mlp(w);
  for (int w : c.top_mlp) s.add_top_mlp(w);
  s.set_parameters(FloatBytes(parameters));
  s.set_optimizer_kind(static_cast<int32_t>(optimizer.params().kind));
  s.set_optimizer_state(FloatBytes(optimizer_state));
  s.set_optimizer_steps(optimizer.step());
  return s;
}

absl::Status LoadDenseState(const v1::DenseState& state, DlrmModel* model,
                            DenseOptimizer* optimizer) {
  if (state.format_version() == 0 || state.format_version() > kDenseStateFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dense state: format_version ", state.format_version(),
        " is not one this worker reads (1..", kDenseStateFormatVersion, ")"));
  }
  const DlrmConfig& c = model->config();
  RETURN_IF_ERROR(CheckInt("num_dense", state.num_dense(), c.num_dense));
  RETURN_IF_ERROR(CheckInt("num_sparse", state.num_sparse(), c.num_sparse));
  RETURN_IF_ERROR(CheckInt("dim", state.dim(), c.embedding_dim));
  RETURN_IF_ERROR(CheckWidths("bottom_mlp", state.bottom_mlp(), c.bottom_mlp));
  RETURN_IF_ERROR(CheckWidths("top_mlp", state.top_mlp(), c.top_mlp));
  RETURN_IF_ERROR(CheckInt("optimizer_kind", state.optimizer_kind(),
                           static_cast<int>(optimizer->params().kind)));
  RETURN_IF_ERROR(CheckBytes("parameters", state.parameters().size(),
                             model->parameters().size()));
  RETURN_IF_ERROR(CheckBytes("optimizer_state", state.optimizer_state().size(),
                             static_cast<size_t>(optimizer->state_size())));
  if (state.optimizer_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense state: optimizer_steps is ", state.optimizer_steps(), " (must be >= 0)"));
  }
  // Every check passed: decode, then change state (the copies to a GPU are
  // the only steps left that can fail, before the step counter moves).
  std::vector<float> parameters(model->parameters().size());
  std::memcpy(parameters.data(), state.parameters().data(),
              state.parameters().size());
  std::vector<float> optimizer_state(
      static_cast<size_t>(optimizer->state_size()));
  if (!state.optimizer_state().empty()) {
    std::memcpy(optimizer_state.data(), state.optimizer_state().data(),
                state.optimizer_state().size());
  }
  RETURN_IF_ERROR(model->WriteParameters(parameters));
  RETURN_IF_ERROR(optimizer->WriteState(optimizer_state));
  return optimizer->set_step(state.optimizer_steps());
}

}  // namespace recps::worker
