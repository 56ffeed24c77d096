// The dense model and optimizer to and from a checkpoint's DenseState:
// bit-exact round trip (continuing after a load equals never stopping), and
// a clear error that changes nothing for a checkpoint of another shape.
#include "worker/model/dense_state.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/optimizer.h"

namespace recps::worker {
namespace {

using ::testing::HasSubstr;

DlrmConfig Config() {
  DlrmConfig c;
  c.num_dense = 4;
  c.num_sparse = 3;
  c.embedding_dim = 4;
  c.bottom_mlp = {8, 4};
  c.top_mlp = {8, 1};
  c.seed = 3;
  return c;
}

OptimizerParams Adam() {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdam;
  p.learning_rate = 0.01f;
  return p;
}

struct Replica {
  std::unique_ptr<DlrmModel> model;
  std::unique_ptr<DenseOptimizer> optimizer;
};

Replica Make(const DlrmConfig& c = Config(), OptimizerParams p = Adam()) {
  Replica r;
  r.model = *DlrmModel::Create(c);
  r.optimizer = *DenseOptimizer::Create(p, r.model->num_parameters());
  return r;
}

// A few deterministic optimizer steps with made-up gradients.
void Train(Replica& r, int steps, int offset) {
  kernels::ExecContext ctx;
  std::vector<float> g(r.model->num_parameters());
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = 0.001f * static_cast<float>(((i * 7 + s + offset) % 13)) - 0.006f;
    }
    ASSERT_TRUE(r.optimizer->Step(r.model->parameters(), g, ctx).ok());
  }
}

bool BitEqual(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(DenseState, RoundTripContinuesBitExact) {
  Replica straight = Make();
  Train(straight, 5, 0);
  const v1::DenseState saved = *SaveDenseState(*straight.model, *straight.optimizer);
  EXPECT_EQ(saved.optimizer_steps(), 5);
  Train(straight, 4, 5);

  // Through the wire bytes, as the coordinator stores it.
  v1::DenseState parsed;
  ASSERT_TRUE(parsed.ParseFromString(saved.SerializeAsString()));
  Replica resumed = Make();
  ASSERT_TRUE(LoadDenseState(parsed, resumed.model.get(), resumed.optimizer.get()).ok());
  EXPECT_EQ(resumed.optimizer->step(), 5);
  Train(resumed, 4, 5);
  EXPECT_TRUE(BitEqual(straight.model->parameters(), resumed.model->parameters()));
  EXPECT_TRUE(BitEqual(straight.optimizer->state(), resumed.optimizer->state()));
  EXPECT_EQ(straight.optimizer->step(), resumed.optimizer->step());
}

TEST(DenseState, OtherShapeIsRefusedAndChangesNothing) {
  Replica source = Make();
  Train(source, 2, 0);
  const v1::DenseState saved = *SaveDenseState(*source.model, *source.optimizer);

  DlrmConfig wider = Config();
  wider.top_mlp = {16, 1};
  Replica other = Make(wider);
  const std::vector<float> before(other.model->parameters().begin(),
                                  other.model->parameters().end());
  absl::Status s = LoadDenseState(saved, other.model.get(), other.optimizer.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("top_mlp is [8,1] in the checkpoint but [16,1]"));
  EXPECT_TRUE(BitEqual(before, other.model->parameters()));
  EXPECT_EQ(other.optimizer->step(), 0);

  DlrmConfig dim8 = Config();
  dim8.embedding_dim = 8;
  dim8.bottom_mlp = {8, 8};
  Replica d = Make(dim8);
  s = LoadDenseState(saved, d.model.get(), d.optimizer.get());
  EXPECT_THAT(s.message(), HasSubstr("dim is 4 in the checkpoint but 8"));

  OptimizerParams adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.learning_rate = 0.1f;
  Replica a = Make(Config(), adagrad);
  s = LoadDenseState(saved, a.model.get(), a.optimizer.get());
  EXPECT_THAT(s.message(), HasSubstr("optimizer_kind"));
}

TEST(DenseState, TruncatedBytesAreRefused) {
  Replica r = Make();
  v1::DenseState saved = *SaveDenseState(*r.model, *r.optimizer);
  saved.mutable_parameters()->resize(saved.parameters().size() - 4);
  absl::Status s = LoadDenseState(saved, r.model.get(), r.optimizer.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("parameters has"));
  v1::DenseState future = *SaveDenseState(*r.model, *r.optimizer);
  future.set_format_version(kDenseStateFormatVersion + 1);
  EXPECT_THAT(LoadDenseState(future, r.model.get(), r.optimizer.get()).message(),
              HasSubstr("format_version"));
}

}  // namespace
}  // namespace recps::worker
