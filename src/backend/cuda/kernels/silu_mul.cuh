// The SiLU-gated MLP product: out = silu(gate) * up, bf16 in and out, f32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deltaserve::cuda {

// gate, up, out: n bf16 elements. Never allocates or syncs.
void launch_silu_mul_bf16(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n,
                          __nv_bfloat16* out, cudaStream_t stream);

// The halves form: gate_up [rows, 2 width] holds gate in its first `width` columns and up in the
// rest; out [rows, width]. Never allocates or syncs.
void launch_silu_mul_halves_bf16(const __nv_bfloat16* gate_up, int64_t rows, int64_t width,
                                 __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
