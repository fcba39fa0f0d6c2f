// Row gather for bf16 matrices: the embedding lookup and the selection of logits rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deltaserve::cuda {

// out[i] = table[rows[i]] for i < n; table [*, cols], out [n, cols] bf16, rows [n] i32 on the
// device; a row index of -1 gives a zero row. Precondition: every other row index is valid. Never
// allocates or syncs.
void launch_gather_rows_bf16(const __nv_bfloat16* table, const int32_t* rows, int n, int cols,
                             __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
