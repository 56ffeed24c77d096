// A naive double-precision DLRM, written from the paper's definition and the
// documented parameter layout, independently of the model's kernels.
#ifndef RECPS_TESTS_WORKER_DLRM_REFERENCE_H_
#define RECPS_TESTS_WORKER_DLRM_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "worker/model/dlrm.h"

namespace recps::worker::testing {

struct RefLayer {
  int64_t in = 0, out = 0;
  bool relu = true;
  int64_t weight_offset = 0, bias_offset = 0;
};

// Bottom MLP then top MLP, each layer weight [out x in] then bias [out].
inline std::vector<RefLayer> Layout(const DlrmConfig& c) {
  std::vector<RefLayer> layers;
  int64_t offset = 0;
  auto add = [&](int64_t in, int64_t out, bool relu) {
    RefLayer l{in, out, relu, offset, offset + in * out};
    offset += in * out + out;
    layers.push_back(l);
  };
  int64_t in = c.num_dense;
  for (int w : c.bottom_mlp) {
    add(in, w, true);
    in = w;
  }
  in = c.embedding_dim +
       static_cast<int64_t>(c.num_sparse + 1) * c.num_sparse / 2;
  for (size_t i = 0; i < c.top_mlp.size(); ++i) {
    add(in, c.top_mlp[i], i + 1 < c.top_mlp.size());
    in = c.top_mlp[i];
  }
  return layers;
}

inline std::vector<double> RefLinear(const RefLayer& l,
                                     const std::vector<double>& p,
                                     const std::vector<double>& x) {
  std::vector<double> y(l.out);
  for (int64_t j = 0; j < l.out; ++j) {
    double s = p[l.bias_offset + j];
    for (int64_t k = 0; k < l.in; ++k) {
      s += p[l.weight_offset + j * l.in + k] * x[k];
    }
    y[j] = l.relu ? std::max(s, 0.0) : s;
  }
  return y;
}

inline std::vector<double> ReferenceLogits(const DlrmConfig& c,
                                           const std::vector<double>& p,
                                           const std::vector<double>& dense,
                                           const std::vector<double>& pooled,
                                           int64_t batch) {
  const std::vector<RefLayer> layers = Layout(c);
  const size_t num_bottom = c.bottom_mlp.size();
  const int f = c.num_sparse, d = c.embedding_dim;
  std::vector<double> logits(batch);
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<double> x(dense.begin() + s * c.num_dense,
                          dense.begin() + (s + 1) * c.num_dense);
    for (size_t l = 0; l < num_bottom; ++l) x = RefLinear(layers[l], p, x);
    // T = [x; e_0; ...; e_{F-1}]; z = [x, <T_i, T_j> for i > j].
    auto t = [&](int r, int k) {
      return r == 0 ? x[k] : pooled[(s * f + (r - 1)) * d + k];
    };
    std::vector<double> z = x;
    for (int i = 1; i <= f; ++i) {
      for (int j = 0; j < i; ++j) {
        double dot = 0.0;
        for (int k = 0; k < d; ++k) dot += t(i, k) * t(j, k);
        z.push_back(dot);
      }
    }
    for (size_t l = num_bottom; l < layers.size(); ++l) {
      z = RefLinear(layers[l], p, z);
    }
    logits[s] = z[0];
  }
  return logits;
}

// Mean sigmoid BCE of the reference logits.
inline double ReferenceLoss(const DlrmConfig& c, const std::vector<double>& p,
                            const std::vector<double>& dense,
                            const std::vector<double>& pooled,
                            const std::vector<double>& labels, int64_t batch) {
  const std::vector<double> x = ReferenceLogits(c, p, dense, pooled, batch);
  double sum = 0.0;
  for (int64_t i = 0; i < batch; ++i) {
    sum += std::max(x[i], 0.0) - x[i] * labels[i] +
           std::log1p(std::exp(-std::fabs(x[i])));
  }
  return sum / static_cast<double>(batch);
}

}  // namespace recps::worker::testing

#endif  // RECPS_TESTS_WORKER_DLRM_REFERENCE_H_
