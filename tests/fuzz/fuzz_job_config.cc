// The job config parser and validator: text (mode 0: the file a person
// writes, read by ReadJobConfig) or a serialized v1::JobConfig (mode 1: how
// a config travels between processes) checked by ValidateJobConfig. An
// accepted config then goes through everything that assumes a validated
// one (EmbeddingDim, the memory estimate, the table specs). Checks: no
// crash or sanitizer report (UBSan catches overflowing sizes); refusals are
// INVALID_ARGUMENT with a message; the estimate is finite and >= 0.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config/job_config.h"
#include "common/config/table_config.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/request_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  if (size < 1) return 0;
  absl::StatusOr<v1::JobConfig> job;
  if (data[0] % 2 == 0) {
    const std::string path = ScratchDir() + "/job.textproto";
    WriteFile(path, data + 1, size - 1);
    job = config::ReadJobConfig(path);
  } else {
    v1::JobConfig parsed;
    if (!parsed.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
    const absl::Status s = config::ValidateJobConfig(parsed);
    if (s.ok()) {
      job = std::move(parsed);
    } else {
      job = s;
    }
  }
  Report("job config", job.status());
  if (!job.ok()) {
    if (job.status().code() != absl::StatusCode::kInvalidArgument ||
        job.status().message().empty()) {
      Fail("job config refused with " + job.status().ToString());
    }
    return 0;
  }
  const int dim = config::EmbeddingDim(*job);
  if (dim <= 0) Fail("EmbeddingDim of a valid job is " + std::to_string(dim));
  const config::WorkerMemoryEstimate est = config::EstimateWorkerMemory(*job);
  if (!std::isfinite(est.total()) || est.total() < 0) Fail("memory estimate");
  (void)config::CheckWorkerMemory(*job, int64_t{1} << 30, "fuzz");
  for (const v1::TableConfig& t : job->tables()) {
    const absl::StatusOr<config::TableSpec> spec = config::TableSpecFromConfig(t);
    if (!spec.ok()) Fail("a valid job's table is refused: " + spec.status().ToString());
  }
  return 0;
}
