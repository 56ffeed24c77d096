// The dense part of DLRM (Naumov et al. 2019) on kernels/dispatch.h, on the
// CPU or on a GPU (the device of the ExecContext given to Create):
//
//   dense [B x num_dense] -> bottom MLP (Linear + ReLU each) -> x [B x D]
//   (x, pooled [B x F x D]) -> dot interaction -> [B x (D + (F + 1) F / 2)]
//   -> top MLP (Linear + ReLU, the last Linear without ReLU) -> logits [B]
//
// The embedding lookups and pooling happen in the training loop; the model
// takes the pooled embeddings and hands back their gradient. Parameters,
// gradients and activations live in kernels::DeviceBuffers of the model's
// device; Forward/Backward take and return host memory and copy on the
// context's stream (one synchronization per call on a GPU).
#ifndef RECPS_WORKER_MODEL_DLRM_H_
#define RECPS_WORKER_MODEL_DLRM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/device_memory.h"
#include "kernels/exec_context.h"

namespace recps::worker {

struct DlrmConfig {
  int num_dense = 13;
  int num_sparse = 26;          // F
  int embedding_dim = 16;       // D
  std::vector<int> bottom_mlp;  // layer widths, last == embedding_dim
  std::vector<int> top_mlp;     // layer widths, last == 1
  uint64_t seed = 0;            // deterministic init
};

// OK, or INVALID_ARGUMENT naming the bad field.
absl::Status ValidateDlrmConfig(const DlrmConfig& config);

class DlrmModel {
 public:
  // Parameters are initialised as in DLRM's reference code:
  // W ~ Normal(0, sqrt(2 / (in + out))), b ~ Normal(0, sqrt(1 / out)), each
  // value a pure function of (seed, layer name, index), so the init does not
  // depend on threads, call order or the other layers' shapes.
  // INVALID_ARGUMENT naming the field for a bad config. The model lives on
  // ctx.device (GPU ctx.cuda_device for kCuda; the init is computed on the
  // host and copied, so every device starts from the same bits); every
  // later call must pass a context of that device. FAILED_PRECONDITION when
  // the device cannot be used (no GPU, a build without CUDA).
  static absl::StatusOr<std::unique_ptr<DlrmModel>> Create(
      const DlrmConfig& config, const kernels::ExecContext& ctx = {});

  DlrmModel(const DlrmModel&) = delete;
  DlrmModel& operator=(const DlrmModel&) = delete;

  // logits[b] for a batch of `batch` samples: dense is batch x num_dense,
  // pooled is batch x F x D, row-major. Copies the inputs and keeps the
  // activations for Backward in buffers that only grow, so a stable batch
  // size allocates nothing. The caller may reuse `dense` and `pooled` as soon
  // as this returns.
  absl::Status Forward(int64_t batch, const float* dense, const float* pooled,
                       float* logits, const kernels::ExecContext& ctx);

  // Backward of the last Forward, from d loss / d logits [batch]: writes
  // d loss / d pooled [batch x F x D] and overwrites gradients(). Uses the
  // current parameters, so call it before the optimizer step.
  // FAILED_PRECONDITION without a preceding Forward.
  absl::Status Backward(const float* grad_logits, float* grad_pooled,
                        const kernels::ExecContext& ctx);

  // Pooling on the model's device (the trainer's --pool_on_device): the
  // pooled input [batch x F x D] in the model's device memory, for the
  // caller to fill (on ctx's stream) before ForwardPooledInPlace. Grows the
  // buffers; invalidates the last Forward.
  absl::StatusOr<float*> PooledInput(int64_t batch);
  // Forward as above, the pooled input already in PooledInput(batch).
  absl::Status ForwardPooledInPlace(int64_t batch, const float* dense,
                                    float* logits,
                                    const kernels::ExecContext& ctx);
  // Backward as above, leaving d loss / d pooled [batch x F x D] in the
  // model's device memory (valid until the next Forward or Backward);
  // queued on ctx's stream, not synchronized.
  absl::StatusOr<const float*> BackwardToDevice(const float* grad_logits,
                                                const kernels::ExecContext& ctx);

  // All parameters and their gradients, one contiguous buffer each with the
  // same layout: bottom MLP layers then top MLP layers, each layer its
  // weight [out x in] row-major (as torch.nn.Linear) then its bias [out].
  // In the MODEL'S DEVICE memory: host memory on the CPU, GPU memory for a
  // CUDA model (for the optimizer, NCCL); use Read*/WriteParameters there.
  absl::Span<float> parameters() {
    return absl::MakeSpan(params_.data(), params_.size());
  }
  absl::Span<float> gradients() {
    return absl::MakeSpan(grads_.data(), grads_.size());
  }
  absl::Span<const float> parameters() const {
    return absl::MakeConstSpan(params_.data(), params_.size());
  }
  absl::Span<const float> gradients() const {
    return absl::MakeConstSpan(grads_.data(), grads_.size());
  }
  int64_t num_parameters() const {
    return static_cast<int64_t>(params_.size());
  }
  const DlrmConfig& config() const { return config_; }
  kernels::Device device() const { return device_; }
  int cuda_device() const { return cuda_device_; }

  // Host copies of the parameters / gradients (waits for queued work), and
  // an overwrite of the parameters from host memory. INVALID_ARGUMENT when
  // `values` does not have num_parameters() floats.
  absl::Status ReadParameters(std::vector<float>* out) const;
  absl::Status ReadGradients(std::vector<float>* out) const;
  absl::Status WriteParameters(absl::Span<const float> values);

 private:
  struct Layer {
    int64_t in = 0;
    int64_t out = 0;
    bool relu = true;
    int64_t weight_offset = 0;  // into params_ / grads_
    int64_t bias_offset = 0;
  };

  DlrmModel(const DlrmConfig& config, const kernels::ExecContext& ctx);
  absl::Status Allocate();
  absl::Status InitParameters();
  // Grows the activation buffers to hold `batch` rows (never shrinks).
  absl::Status Reserve(int64_t batch);
  // INVALID_ARGUMENT when ctx is not of the model's device.
  absl::Status CheckContext(const kernels::ExecContext& ctx,
                            const char* op) const;
  // Forward's checks and input copies (dense_in_, pooled_in_), then batch_.
  // pooled == nullptr with pooled_in_place: already in pooled_in_.
  absl::Status LoadInputs(int64_t batch, const float* dense,
                          const float* pooled, const kernels::ExecContext& ctx,
                          bool pooled_in_place = false);
  // Forward's layers and the logits copied to the host, synchronized.
  absl::Status ForwardToHost(int64_t batch, float* logits,
                             const kernels::ExecContext& ctx);
  // Backward from grad_act_.back() (already filled) to the parameter
  // gradients and d loss / d pooled into `grad_pooled` (model memory).
  absl::Status BackwardLayers(float* grad_pooled,
                              const kernels::ExecContext& ctx);
  // A buffer of the model's device.
  kernels::DeviceBuffer NewBuffer() const {
    return kernels::DeviceBuffer(device_, cuda_device_);
  }
  // The input of layer l as a batch x in matrix.
  const float* LayerInput(size_t l) const;
  absl::Status LinearForward(size_t l, const kernels::ExecContext& ctx);
  // Bottom MLP, interaction, top MLP on the copied inputs (batch_ rows).
  absl::Status ForwardLayers(const kernels::ExecContext& ctx);
  // dy (activation gradient of layer l's output, masked in place) -> the
  // layer's parameter gradients and, when grad_x != nullptr, d loss / d x.
  absl::Status LinearBackward(size_t l, float* grad_x,
                              const kernels::ExecContext& ctx);

  friend absl::StatusOr<float> DlrmTrainStep(DlrmModel&, int64_t, const float*,
                                             const float*, const float*,
                                             float*, float*,
                                             const kernels::ExecContext&);

  DlrmConfig config_;
  kernels::Device device_ = kernels::Device::kCpu;
  int cuda_device_ = 0;
  std::vector<Layer> layers_;  // bottom MLP, then top MLP
  size_t num_bottom_ = 0;
  int64_t interaction_width_ = 0;
  kernels::DeviceBuffer params_;
  kernels::DeviceBuffer grads_;

  // Per-step state, sized for `capacity_` rows, on the model's device.
  int64_t batch_ = -1;  // of the last Forward; -1 before the first
  int64_t capacity_ = 0;
  kernels::DeviceBuffer dense_in_;          // batch x num_dense
  kernels::DeviceBuffer pooled_in_;         // batch x F x D
  kernels::DeviceBuffer interaction_;       // batch x interaction_width_
  kernels::DeviceBuffer grad_interaction_;  // batch x interaction_width_
  std::vector<kernels::DeviceBuffer> act_;  // per layer: batch x out
  std::vector<kernels::DeviceBuffer> grad_act_;
  kernels::DeviceBuffer grad_pooled_;       // GPU or BackwardToDevice: B x F x D
  // DlrmTrainStep scratch on a GPU: the labels [batch] and the mean loss.
  kernels::DeviceBuffer labels_;
  kernels::DeviceBuffer loss_;
};

// One training step's model part: Forward, mean sigmoid BCE against
// `labels` [batch], Backward. Returns the mean loss, writes d loss / d pooled
// to grad_pooled and the parameter gradients to model.gradients(); writes
// the logits to `logits_out` [batch] when it is not null (for metrics).
absl::StatusOr<float> DlrmTrainStep(DlrmModel& model, int64_t batch,
                                    const float* dense, const float* pooled,
                                    const float* labels, float* grad_pooled,
                                    float* logits_out,
                                    const kernels::ExecContext& ctx);

}  // namespace recps::worker

#endif  // RECPS_WORKER_MODEL_DLRM_H_
