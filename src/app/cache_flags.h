// The prefix-cache flags of `serve` (vLLM's names where vLLM has one):
//   --enable-prefix-caching / --no-enable-prefix-caching   on by default
//   --mamba-block-size N            the GDN snapshot grid in tokens (default 64; a multiple of 64)
//   --prefix-cache-snapshot-fraction F   share of the cache memory given to snapshots (0.25)
//   --mamba-ssm-cache-dtype auto|float32|bfloat16   the GDN recurrent state between steps (auto:
//                                   float32, the Qwen3.5 checkpoints' mamba_ssm_dtype)
//   --kv-cache-dtype auto|fp8|fp8_e4m3   the full-attention KV cache: auto keeps the activations'
//                                   dtype; fp8 (= fp8_e4m3) stores e4m3 with scale 1, as vLLM does
//                                   for checkpoints without KV scales: half the bytes a token
#pragma once

#include <set>
#include <string>

#include "app/args.h"
#include "engine/engine.h"

namespace deltaserve::app {

const std::set<std::string>& cache_value_flags();
const std::set<std::string>& cache_switches();
// --mamba-ssm-cache-dtype's dtype; throws deltaserve::Error for other values.
DType ssm_state_dtype_flag(const Args& a);
// --kv-cache-dtype: true for fp8 / fp8_e4m3; throws deltaserve::Error for values other than auto.
bool kv_cache_fp8_flag(const Args& a);
// Sets the engine's prefix-cache, state-dtype and KV-cache-dtype fields and returns the share of
// the cache memory for snapshots (MemoryBudget::snapshot_fraction; 0 when caching is off); throws
// deltaserve::Error for contradictory or out-of-range values (before anything loads).
double apply_cache_flags(const Args& a, engine::EngineConfig& cfg);

}  // namespace deltaserve::app
