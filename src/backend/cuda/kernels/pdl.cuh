// Programmatic dependent launch (sm_90): a kernel launched with the programmatic stream
// serialization attribute may start while the kernel before it in the stream still runs, once
// every block of that one has called allow_successor (or exited); it must call
// wait_for_predecessor before it touches anything the predecessor writes or reads.
#pragma once

namespace deltaserve::cuda::pdl {

// Waits until the grids this one depends on have completed and their memory is visible (returns
// at once for a kernel launched without the attribute).
__device__ inline void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the next kernel in the stream, if launched with the attribute, start now (its blocks then
// take SM room beside this kernel's; a no-op for other successors).
__device__ inline void allow_successor() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace deltaserve::cuda::pdl
