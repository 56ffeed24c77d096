// CPU sigmoid + binary cross-entropy on logits.
//
// The mean loss is summed in double over fixed-size blocks whose partials
// are added in block order: the same bits for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "kernels/loss.h"

namespace recps::kernels {
namespace {

// Elements per block; fixed so the summation order never depends on the pool.
constexpr int64_t kBlock = 4096;

// sigmoid(x) without overflow: exp is only taken of -|x|.
inline float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

// max(x, 0) - x * y + log(1 + exp(-|x|)), in double: exact enough that the
// float mean is correctly rounded in practice, and finite for any finite x.
inline double BceTerm(float logit, float label) {
  const double x = logit;
  const double y = label;
  return std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::fabs(x)));
}

}  // namespace

absl::Status SigmoidBceCpu(const SigmoidBceArgs& args, const ExecContext& ctx) {
  const SigmoidBceArgs& a = args;
  if (a.n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SigmoidBceCpu: n must be >= 1, got ", a.n));
  }
  if (a.logits == nullptr || a.labels == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SigmoidBceCpu: ", a.logits == nullptr ? "logits" : "labels",
        " is null (n=", a.n, ")"));
  }
  const int64_t n = a.n;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
  absl::InlinedVector<double, 16> block_loss(a.loss ? num_blocks : 0);
  const float n_float = static_cast<float>(n);
  ParallelFor(ctx.pool, num_blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t begin = b * kBlock;
      const int64_t end = std::min(n, begin + kBlock);
      // The loss first: the other outputs may overwrite the logits in place.
      if (a.loss != nullptr) {
        double sum = 0.0;
        for (int64_t i = begin; i < end; ++i) {
          sum += BceTerm(a.logits[i], a.labels[i]);
        }
        block_loss[b] = sum;
      }
      if (a.probabilities != nullptr || a.grad_logits != nullptr) {
        for (int64_t i = begin; i < end; ++i) {
          const float p = Sigmoid(a.logits[i]);
          if (a.probabilities != nullptr) a.probabilities[i] = p;
          if (a.grad_logits != nullptr) {
            a.grad_logits[i] = (p - a.labels[i]) / n_float;
          }
        }
      }
    }
  });
  if (a.loss != nullptr) {
    double total = 0.0;
    for (double s : block_loss) total += s;
    *a.loss = static_cast<float>(total / static_cast<double>(n));
  }
  return absl::OkStatus();
}

}  // namespace recps::kernels
