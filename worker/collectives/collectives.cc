#include "worker/collectives/collectives.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace recps::worker {

Collectives::~Collectives() = default;

absl::Status AllReduceInBuckets(Collectives& collectives,
                                absl::Span<float> data, int64_t bucket_floats) {
  if (bucket_floats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduceInBuckets: bucket_floats must be >= 1, got ", bucket_floats));
  }
  const size_t bucket = static_cast<size_t>(bucket_floats);
  for (size_t offset = 0; offset < data.size(); offset += bucket) {
    const size_t n = std::min(bucket, data.size() - offset);
    absl::Status status = collectives.AllReduceSum(data.subspan(offset, n));
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("bucket at float offset ", offset, ": ",
                                       status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCollectives::AllReduceSum(absl::Span<float>) {
  return absl::OkStatus();
}

absl::Status LocalCollectives::Broadcast(absl::Span<float>, int root) {
  if (root != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " out of range [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Status LocalCollectives::Barrier() { return absl::OkStatus(); }

}  // namespace recps::worker
