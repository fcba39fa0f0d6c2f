// The memory plan: its numbers equal what the runner and the backend actually allocate, each
// budget kind sizes the KV pages as documented, a plan that cannot hold one request fails, and
// the default max_num_seqs on a device trades state slots for KV room.
#include "runtime/memory_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <string_view>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/loader.h"
#include "runtime/model_runner.h"
#include "test_util.h"

namespace deltaserve::runtime {
namespace {

PlanLimits limits() {
  return {.max_num_seqs = 3,
          .max_num_batched_tokens = 40,
          .max_model_len = 100,
          .page_size = 16,
          .num_snapshots = 2};
}

TEST(MemoryPlan, RunnerAllocatesExactlyThePlan) {
  backend::CpuBackend be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  MemoryBudget budget;
  budget.pages = 20;
  const MemoryPlan plan = plan_for(*m, limits(), budget);
  EXPECT_EQ(plan.num_pages, 20);
  EXPECT_EQ(plan.num_slots, 3);
  EXPECT_EQ(plan.pad_slot(), 5) << "3 request slots, 2 snapshot slots, then the pad slot";
  EXPECT_EQ(plan.snapshot_slot(1), 4);
  const int64_t before = be.allocated_bytes();
  {
    ModelRunner runner(*m, plan);
    EXPECT_EQ(be.allocated_bytes() - before, plan.runner_bytes())
        << "caches " << plan.kv_bytes() << " + " << plan.state_bytes() << ", step buffers "
        << plan.scratch_bytes;
  }
  EXPECT_EQ(be.allocated_bytes(), before) << "the runner frees what it allocated";
  // Independent arithmetic for the cache sizes of the tiny model.
  const model::ModelConfig& c = m->rank_config();
  const int64_t full = c.num_layers_of(model::LayerType::kFullAttention);
  const int64_t gdn = c.num_layers_of(model::LayerType::kLinearAttention);
  EXPECT_EQ(plan.kv_bytes(), 21 * full * 2 * 16 * c.num_kv_heads * c.head_dim * 4);
  EXPECT_EQ(
      plan.state_bytes(),
      6 * gdn *
          (c.conv_dim() * (c.conv_kernel - 1) + c.lin_num_v_heads * c.lin_k_dim * c.lin_v_dim) * 4);
}

// The runner lays the step buffers out in this order: a pair of projections a backend runs as
// one batched GEMM (GDN b / a, attention k / v) has its outputs in its weights' order.
TEST(MemoryPlan, PairedOutputsInTheirWeightsOrder) {
  backend::CpuBackend be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  const std::vector<ScratchBuffer> list = scratch_buffers(m->rank_config(), DType::kF32, 8, 2);
  const auto at = [&](std::string_view name) {
    for (size_t i = 0; i < list.size(); ++i)
      if (name == list[i].name) return static_cast<int>(i);
    return -1;
  };
  EXPECT_EQ(at("a"), at("b") + 1);
  EXPECT_EQ(at("v"), at("k") + 1);
  EXPECT_GE(at("b"), 0);
  EXPECT_GE(at("k"), 0);
}

// --mamba-ssm-cache-dtype bfloat16: the recurrent part of a state slot halves, and the runner
// allocates the state in that dtype, exactly the plan.
TEST(MemoryPlan, Bf16GdnStateHalvesTheRecurrentSlot) {
  backend::CpuBackend be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  const model::ModelConfig& c = m->rank_config();
  const int64_t gdn = c.num_layers_of(model::LayerType::kLinearAttention);
  const int64_t recurrent = gdn * c.lin_num_v_heads * c.lin_k_dim * c.lin_v_dim;
  EXPECT_EQ(slot_bytes(c, DType::kF32, DType::kF32) - slot_bytes(c, DType::kF32, DType::kBF16),
            2 * recurrent);
  PlanLimits l = limits();
  l.state_dtype = DType::kBF16;
  MemoryBudget budget;
  budget.pages = 20;
  const MemoryPlan plan = plan_for(*m, l, budget);
  EXPECT_EQ(plan.state_dtype, DType::kBF16);
  EXPECT_EQ(plan.slot_bytes, slot_bytes(c, DType::kF32, DType::kBF16));
  const int64_t before = be.allocated_bytes();
  ModelRunner runner(*m, plan);
  EXPECT_EQ(be.allocated_bytes() - before, plan.runner_bytes());
}

// --kv-cache-dtype fp8: a page's bytes are a quarter of f32's (half of bf16's), a device share
// holds about twice the bf16 pages, and the runner allocates the pages in fp8, exactly the plan.
TEST(MemoryPlan, Fp8KvCacheHalvesTheBf16Pages) {
  const model::ModelConfig c = model::load_config("");
  EXPECT_EQ(page_bytes(c, DType::kF32, 16), 4 * page_bytes(c, DType::kFP8E4M3, 16));
  EXPECT_EQ(page_bytes(c, DType::kBF16, 16), 2 * page_bytes(c, DType::kFP8E4M3, 16));
  PlanLimits l = limits();
  MemoryBudget b;
  b.kind = MemoryBudget::Kind::kDeviceShare;
  b.utilization = 0.5;
  b.device_total = int64_t{8} << 30;
  b.device_free = int64_t{7} << 30;
  const MemoryPlan bf16 = plan_memory(c, DType::kBF16, l, b, 0);
  l.kv_cache_fp8 = true;
  const MemoryPlan fp8 = plan_memory(c, DType::kBF16, l, b, 0);
  EXPECT_EQ(bf16.kv_dtype, DType::kBF16);
  EXPECT_EQ(fp8.kv_dtype, DType::kFP8E4M3);
  EXPECT_EQ(fp8.page_bytes * 2, bf16.page_bytes);
  EXPECT_GE(fp8.num_pages, 2 * bf16.num_pages);
  EXPECT_LE(fp8.num_pages, 2 * bf16.num_pages + 2);  // the pad page's bytes
  EXPECT_NE(fp8.describe().find("F8_E4M3"), std::string::npos);

  backend::CpuBackend be;
  auto m = model::load_model((testing::test_data() / "tiny_real").string(),
                             model::LoadFormat::kAuto, be, false);
  PlanLimits tl = limits();
  tl.kv_cache_fp8 = true;
  MemoryBudget pages;
  pages.pages = 20;
  const MemoryPlan plan = plan_for(*m, tl, pages);
  EXPECT_EQ(plan.page_bytes, page_bytes(m->rank_config(), DType::kFP8E4M3, 16));
  const int64_t before = be.allocated_bytes();
  ModelRunner runner(*m, plan);
  EXPECT_EQ(be.allocated_bytes() - before, plan.runner_bytes());
}

TEST(MemoryPlan, BudgetsSizeTheKvPages) {
  const model::ModelConfig c = model::load_config("");
  const PlanLimits l = limits();  // 7 pages per request of 100 tokens
  MemoryBudget b;
  EXPECT_EQ(plan_memory(c, DType::kF32, l, b, 0).num_pages, 7 * 3) << "default: min(seqs, 4)";
  b.kind = MemoryBudget::Kind::kRequests;
  b.requests = 5;
  EXPECT_EQ(plan_memory(c, DType::kF32, l, b, 0).num_pages, 35);
  b.kind = MemoryBudget::Kind::kHostBytes;
  const int64_t page = page_bytes(c, DType::kF32, 16);
  b.kv_bytes = 10 * page + page / 2;
  EXPECT_EQ(plan_memory(c, DType::kF32, l, b, 0).num_pages, 10);
  b.kv_bytes = 1000 * page;
  EXPECT_EQ(plan_memory(c, DType::kF32, l, b, 0).num_pages, 21) << "at most room for max_num_seqs";
  // Device share: what is left of 50% of 8 GiB after 1 GiB in use, the slots, the step buffers,
  // the workspace, the reserve and the pad page.
  b.kind = MemoryBudget::Kind::kDeviceShare;
  b.utilization = 0.5;
  b.device_total = int64_t{8} << 30;
  b.device_free = int64_t{7} << 30;
  const int64_t ws = int64_t{100} << 20;
  const MemoryPlan p = plan_memory(c, DType::kBF16, l, b, ws);
  const int64_t rest = (int64_t{4} << 30) - (int64_t{1} << 30) - p.state_bytes() - p.scratch_bytes -
                       ws - MemoryPlan::kDeviceReserve - p.page_bytes;
  EXPECT_EQ(p.num_pages, rest / p.page_bytes);
  EXPECT_LE(p.device_used + p.runner_bytes() + p.workspace_bytes + p.reserve_bytes,
            b.device_total / 2);
  EXPECT_NE(p.describe().find("KV pages"), std::string::npos);
  EXPECT_DOUBLE_EQ(p.max_concurrency(100), p.num_pages / 7.0);  // 7 pages of 16 a request
  EXPECT_DOUBLE_EQ(p.max_concurrency(112), p.num_pages / 7.0);
  EXPECT_DOUBLE_EQ(p.max_concurrency(113), p.num_pages / 8.0);
}

TEST(MemoryPlan, FailsClosedWhenOneRequestCannotFit) {
  const model::ModelConfig c = model::load_config("");
  MemoryBudget b;
  b.kind = MemoryBudget::Kind::kHostBytes;
  b.kv_bytes = page_bytes(c, DType::kF32, 16) * 3;  // 3 pages; a request needs 7
  try {
    plan_memory(c, DType::kF32, limits(), b, 0);
    FAIL() << "a plan without room for one request";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 7"), std::string::npos) << e.what();
  }
}

// --max-model-len auto: where one request of max_model_len does not fit, a plan of the pages
// there are instead of an error; with no page left (a device share used up), an error still.
TEST(MemoryPlan, FitMaxModelLenPlansThePagesThereAre) {
  const model::ModelConfig c = model::load_config("");
  PlanLimits l = limits();  // 7 pages per request of 100 tokens
  l.fit_max_model_len = true;
  MemoryBudget b;
  b.kind = MemoryBudget::Kind::kHostBytes;
  b.kv_bytes = page_bytes(c, DType::kF32, 16) * 3;
  EXPECT_EQ(plan_memory(c, DType::kF32, l, b, 0).num_pages, 3);
  b.kv_bytes = page_bytes(c, DType::kF32, 16) * 8;
  EXPECT_EQ(plan_memory(c, DType::kF32, l, b, 0).num_pages, 8) << "fits: as without the flag";
  b.kind = MemoryBudget::Kind::kDeviceShare;  // nothing left for pages
  b.utilization = 0.5;
  b.device_total = int64_t{1} << 30;
  b.device_free = int64_t{1} << 29;
  EXPECT_THROW(plan_memory(c, DType::kF32, l, b, 0), Error) << "not one page";
  b.kind = MemoryBudget::Kind::kHostBytes;
  l.fit_max_model_len = false;
  b.kv_bytes = page_bytes(c, DType::kF32, 16) * 3;
  EXPECT_THROW(plan_memory(c, DType::kF32, l, b, 0), Error) << "without the flag";
}

// Without --max-num-seqs on a device: the most of 1024 / 512 / 256 / 128 requests whose state
// slots take at most a quarter of the plan's cache memory (KV + slots + snapshots), else 64. Over a
// range of device sizes: each answer obeys that rule, twice the answer does not, more memory never
// gives fewer, and the range reaches both the fallback and the top.
TEST(MemoryPlan, AutoMaxNumSeqsTradesStateSlotsForKvRoom) {
  const model::ModelConfig c = model::load_config("");
  const int64_t slot = slot_bytes(c, DType::kBF16);
  PlanLimits l = limits();
  MemoryBudget b;
  b.kind = MemoryBudget::Kind::kDeviceShare;
  b.utilization = 0.9;
  b.snapshot_fraction = 0.25;
  auto plan_with = [&](int32_t n) {
    l.max_num_seqs = n;
    return plan_memory(c, DType::kBF16, l, b, 0);
  };
  auto obeys = [&](int32_t n) {
    try {
      const MemoryPlan p = plan_with(n);
      return 4 * int64_t{n} * slot <= p.kv_bytes() + p.state_bytes();
    } catch (const Error&) {
      return false;
    }
  };
  int32_t previous = 0;
  std::set<int32_t> seen;
  for (int64_t mib = 512; mib <= (int64_t{1} << 20); mib *= 2) {
    b.device_total = b.device_free = mib << 20;
    const int32_t n = auto_max_num_seqs(plan_with);
    seen.insert(n);
    SCOPED_TRACE(std::to_string(mib) + " MiB: " + std::to_string(n));
    EXPECT_TRUE(n == kFallbackMaxNumSeqs || obeys(n));
    if (n < 1024) EXPECT_FALSE(obeys(n == kFallbackMaxNumSeqs ? 128 : 2 * n));
    EXPECT_GE(n, previous);
    previous = n;
  }
  EXPECT_TRUE(seen.count(kFallbackMaxNumSeqs) && seen.count(1024)) << "sizes: " << seen.size();
  EXPECT_GE(seen.size(), 4u) << "the answer grows with the memory";
}

}  // namespace
}  // namespace deltaserve::runtime
