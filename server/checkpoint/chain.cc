#include "server/checkpoint/chain.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace recps::server::checkpoint {
namespace {

std::string StepsThere(const std::vector<CheckpointInfo>& complete) {
  if (complete.empty()) return "there is none";
  std::vector<uint64_t> steps;
  for (const CheckpointInfo& c : complete) steps.push_back(c.step);
  if (steps.size() > 20) {
    steps.erase(steps.begin(), steps.end() - 20);
    return absl::StrCat("the newest 20 are ", absl::StrJoin(steps, ", "));
  }
  return absl::StrCat("there are ", absl::StrJoin(steps, ", "));
}

}  // namespace

absl::StatusOr<CheckpointRef> ParseCheckpointRef(absl::string_view ref) {
  CheckpointRef out;
  const size_t at = ref.rfind('@');
  absl::string_view root = ref;
  if (at != absl::string_view::npos) {
    const absl::string_view digits = ref.substr(at + 1);
    uint64_t step = 0;
    if (digits.empty() ||
        !std::all_of(digits.begin(), digits.end(),
                     [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(digits, &step)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", ref, "': after '@' comes a step number, got '",
          digits, "' (use ROOT or ROOT@STEP)"));
    }
    out.step = step;
    root = ref.substr(0, at);
  }
  if (root.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", ref, "' names no directory (use ROOT or ROOT@STEP)"));
  }
  out.root = std::string(root);
  return out;
}

absl::StatusOr<std::vector<CheckpointInfo>> ChainOf(
    const std::vector<CheckpointInfo>& complete, uint64_t step,
    absl::string_view root) {
  auto find = [&](uint64_t s) -> const CheckpointInfo* {
    for (const CheckpointInfo& c : complete) {
      if (c.step == s) return &c;
    }
    return nullptr;
  };
  const CheckpointInfo* cur = find(step);
  if (cur == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no complete checkpoint at step ", step, " under ", root, "; ",
        StepsThere(complete)));
  }
  std::vector<CheckpointInfo> chain;
  const uint64_t full_step = cur->manifest.full_step();
  while (true) {
    chain.push_back(*cur);
    const v1::CheckpointManifest& m = cur->manifest;
    if (m.kind() == v1::CHECKPOINT_KIND_FULL ||
        m.kind() == v1::CHECKPOINT_KIND_UNSPECIFIED) {
      if (chain.size() > 1 && cur->step != full_step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "broken checkpoint chain: ", chain.front().dir,
            " starts from the full checkpoint at step ", full_step,
            " but its chain reaches the full checkpoint ", cur->dir,
            " (step ", cur->step, ")"));
      }
      break;
    }
    if (m.kind() != v1::CHECKPOINT_KIND_INCREMENTAL) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", cur->dir, " has unknown kind ",
          static_cast<int>(m.kind()), "; this build reads FULL and INCREMENTAL"));
    }
    if (m.base_step() >= cur->step || m.full_step() > m.base_step() ||
        m.full_step() != full_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "broken checkpoint chain at ", cur->dir, ": base_step ",
          m.base_step(), ", full_step ", m.full_step(), " (step ", cur->step,
          ", chain of ", chain.front().dir, " starts at full step ", full_step,
          "); an increment's base must be older and share its full step"));
    }
    const CheckpointInfo* base = find(m.base_step());
    if (base == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "incremental checkpoint ", cur->dir, " needs its base at step ",
          m.base_step(), ", which is not a complete checkpoint under ", root,
          " (missing or partial); restore an older full checkpoint instead"));
    }
    const v1::CheckpointManifest& b = base->manifest;
    if (b.kind() == v1::CHECKPOINT_KIND_INCREMENTAL && b.full_step() != full_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "broken checkpoint chain: ", cur->dir, " has full_step ", full_step,
          " but its base ", base->dir, " has full_step ", b.full_step()));
    }
    cur = base;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

absl::StatusOr<std::vector<CheckpointInfo>> ResolveChain(
    const std::string& root, std::optional<uint64_t> step, FileSystem* fs) {
  ASSIGN_OR_RETURN(const std::vector<CheckpointInfo> complete,
                   ListCheckpoints(root, fs));
  if (!step.has_value()) {
    if (complete.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "no complete checkpoint under ", root,
          " (a directory without a valid MANIFEST is not one)"));
    }
    step = complete.back().step;
  }
  return ChainOf(complete, *step, root);
}

absl::StatusOr<std::vector<CheckpointInfo>> ResolveChain(
    const CheckpointRef& ref, FileSystem* fs) {
  return ResolveChain(ref.root, ref.step, fs);
}

std::vector<std::string> ChainDirs(const std::vector<CheckpointInfo>& chain) {
  std::vector<std::string> out;
  for (const CheckpointInfo& c : chain) out.push_back(c.dir);
  return out;
}

}  // namespace recps::server::checkpoint
