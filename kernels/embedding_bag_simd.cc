// Embedding-bag loops, built once per ISA (see cmake/RecpsIsa.cmake).
// Arguments arrive validated by embedding_bag_cpu.cc.
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/embedding_bag_internal.h"
#include "kernels/row_math_simd.h"

namespace recps::kernels::RECPS_ISA_NS {
namespace {

// How many positions ahead to prefetch: enough rows in flight to cover DRAM
// latency, few enough that they are still in cache when used.
constexpr int64_t kPrefetchDistance = 16;

template <typename Row>
void ForwardRange(const EmbeddingBagForwardArgs& a, int64_t begin,
                  int64_t end) {
  const Row* rows = static_cast<const Row*>(a.rows);
  const int64_t* __restrict idx = a.indices;
  const float* __restrict psw = a.per_sample_weights;
  const int dim = a.dim;
  const int64_t stride = a.row_stride;
  const int64_t row_bytes = static_cast<int64_t>(dim) * sizeof(Row);
  const int64_t out_stride = a.output_stride > 0 ? a.output_stride : dim;
  // The first term of each output row is stored, later ones added.
  auto axpy = [&](float* out, int64_t p, float w, auto assign) {
    constexpr bool kAssign = decltype(assign)::value;
    if constexpr (sizeof(Row) == 4) {
      AxpyRow<kAssign>(out, rows + idx[p] * stride, w, dim);
    } else {
      AxpyRowHalf<kAssign>(out, rows + idx[p] * stride, w, dim);
    }
  };
  const std::true_type kFirst;
  const std::false_type kRest;

  if (a.pooling == PoolingMode::kNone) {
    // Positions [begin, end), one output row each.
    for (int64_t p = begin; p < end; ++p) {
      if (p + kPrefetchDistance < end) {
        PrefetchRow(rows + idx[p + kPrefetchDistance] * stride, row_bytes);
      }
      axpy(a.output + p * out_stride, p, psw ? psw[p] : 1.0f, kFirst);
    }
    return;
  }

  // Bags [begin, end); prefetch runs over positions across bag boundaries.
  const int64_t* offsets = a.offsets;
  const int64_t pos_end = offsets[end];
  for (int64_t b = begin; b < end; ++b) {
    float* out = a.output + b * out_stride;
    const int64_t lo = offsets[b];
    const int64_t hi = offsets[b + 1];
    if (lo == hi) std::memset(out, 0, sizeof(float) * dim);
    for (int64_t p = lo; p < hi; ++p) {
      if (p + kPrefetchDistance < pos_end) {
        PrefetchRow(rows + idx[p + kPrefetchDistance] * stride, row_bytes);
      }
      if (p == lo) {
        axpy(out, p, psw ? psw[p] : 1.0f, kFirst);
      } else {
        axpy(out, p, psw ? psw[p] : 1.0f, kRest);
      }
    }
    if (a.pooling == PoolingMode::kMean && hi > lo) {
      const float n = static_cast<float>(hi - lo);
      for (int j = 0; j < dim; ++j) out[j] /= n;
    }
  }
}

}  // namespace

void EmbeddingBagForwardRange(const EmbeddingBagForwardArgs& args,
                              int64_t begin, int64_t end) {
  if (args.dtype == RowDType::kFloat16) {
    ForwardRange<uint16_t>(args, begin, end);
  } else {
    ForwardRange<float>(args, begin, end);
  }
}

void EmbeddingBagBackwardRange(const EmbeddingBagBackwardPlan& plan,
                               int64_t row_begin, int64_t row_end) {
  const int dim = plan.dim;
  const int64_t stride = plan.grad_output_stride;
  // Accumulate: a row's sum is formed here, then added as one term, so a
  // row shared by several calls sums call by call (the order the trainer
  // had with a scratch buffer per feature). Rows up to kMaxStackDim wide
  // (all dims in practice) use the stack.
  constexpr int kMaxStackDim = 1024;
  float stack_sum[kMaxStackDim];
  std::vector<float> heap_sum;
  float* sum = stack_sum;
  if (plan.accumulate && dim > kMaxStackDim) {
    heap_sum.resize(dim);
    sum = heap_sum.data();
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* out = plan.grad_rows + r * dim;
    const int64_t lo = plan.row_begin[r], hi = plan.row_begin[r + 1];
    if (lo == hi) {
      if (!plan.accumulate) std::memset(out, 0, sizeof(float) * dim);
      continue;
    }
    float* target = plan.accumulate ? sum : out;
    for (int64_t e = lo; e < hi; ++e) {
      if (e + 4 < hi) {
        PrefetchRow(plan.grad_output + plan.source_row[e + 4] * stride,
                    static_cast<int64_t>(dim) * sizeof(float));
      }
      const float* src = plan.grad_output + plan.source_row[e] * stride;
      if (e == lo) {
        AxpyRow<true>(target, src, plan.scale[e], dim);
      } else {
        AxpyRow(target, src, plan.scale[e], dim);
      }
    }
    if (plan.accumulate) AxpyRow(out, sum, 1.0f, dim);
  }
}

}  // namespace recps::kernels::RECPS_ISA_NS
