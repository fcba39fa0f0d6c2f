// A CUDA injection library (CUDA_INJECTION64_PATH=libkernel_trace.so): records every kernel the
// process runs — CUDA-graph replays and programmatic dependent launches included — through CUPTI's
// activity API and writes one CSV line a kernel to $DS_KERNEL_TRACE (default kernel_trace.csv) at
// exit: start and end (ns, GPU clock), grid, graph id and node, correlation id, mangled name.
// tools/kernel_trace/timeline.py turns a decode step's lines into each kernel's share of the step.
// No GPU code of ours changes; the tracer costs a timestamp pair a kernel.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

std::mutex lines_mutex;
std::vector<std::string> lines;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void keep(const CUpti_ActivityKernel10& k) {
  char head[256];
  std::snprintf(head, sizeof(head), "%llu,%llu,%d,%d,%d,%d,%u,%llu,%u,",
                static_cast<unsigned long long>(k.start), static_cast<unsigned long long>(k.end),
                k.gridX, k.gridY, k.gridZ, k.blockX, k.graphId,
                static_cast<unsigned long long>(k.graphNodeId), k.correlationId);
  const std::lock_guard<std::mutex> lock(lines_mutex);
  lines.push_back(std::string(head) + (k.name ? k.name : "?"));
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
      keep(*reinterpret_cast<const CUpti_ActivityKernel10*>(record));
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("DS_KERNEL_TRACE");
  FILE* f = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!f) return;
  std::fprintf(f, "start,end,grid_x,grid_y,grid_z,block_x,graph_id,graph_node,correlation,name\n");
  const std::lock_guard<std::mutex> lock(lines_mutex);
  for (const std::string& l : lines) std::fprintf(f, "%s\n", l.c_str());
  std::fclose(f);
}

}  // namespace

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
    return 0;
  }
  std::atexit(write_trace);
  return 1;
}
