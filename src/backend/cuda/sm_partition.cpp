#include "backend/cuda/sm_partition.h"

#include <cudaTypedefs.h>

#include <string>

#include "backend/cuda/driver_entry.h"
#include "core/error.h"

namespace deltaserve::cuda {
namespace {

// The driver's green-context functions (CUDA 12.4; streams 12.5).
struct GreenContextApi {
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDeviceGetDevResource_v12040 device_resource;
  PFN_cuDevSmResourceSplitByCount_v12040 split_by_count;
  PFN_cuDevResourceGenerateDesc_v12040 generate_desc;
  PFN_cuGreenCtxCreate_v12040 create;
  PFN_cuGreenCtxDestroy_v12040 destroy;
  PFN_cuGreenCtxStreamCreate_v12050 stream_create;
};

const GreenContextApi& api() {
  static const GreenContextApi a{
      driver_entry<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000),
      driver_entry<PFN_cuDeviceGetDevResource_v12040>("cuDeviceGetDevResource", 12040),
      driver_entry<PFN_cuDevSmResourceSplitByCount_v12040>("cuDevSmResourceSplitByCount", 12040),
      driver_entry<PFN_cuDevResourceGenerateDesc_v12040>("cuDevResourceGenerateDesc", 12040),
      driver_entry<PFN_cuGreenCtxCreate_v12040>("cuGreenCtxCreate", 12040),
      driver_entry<PFN_cuGreenCtxDestroy_v12040>("cuGreenCtxDestroy", 12040),
      driver_entry<PFN_cuGreenCtxStreamCreate_v12050>("cuGreenCtxStreamCreate", 12050)};
  return a;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw DeviceError(std::string(what) + " failed (CUresult " + std::to_string(r) + ")");
}

CUgreenCtx green_context(CUdevice dev, CUdevResource& sms) {
  CUdevResourceDesc desc{};
  check(api().generate_desc(&desc, &sms, 1), "cuDevResourceGenerateDesc");
  CUgreenCtx ctx = nullptr;
  check(api().create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
  return ctx;
}

}  // namespace

std::pair<SmPartition, SmPartition> SmPartition::split(int device, int sms) {
  // The primary context first (green contexts retain it; made here once, not per context).
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    throw DeviceError(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  if (const cudaError_t e = cudaFree(nullptr); e != cudaSuccess)
    throw DeviceError(std::string("CUDA context: ") + cudaGetErrorString(e));
  const GreenContextApi& g = api();
  CUdevice dev = 0;
  check(g.device_get(&dev, device), "cuDeviceGet");
  CUdevResource all{};
  check(g.device_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  if (sms < 1 || static_cast<unsigned>(sms) >= all.sm.smCount)
    throw Error("an SM share of " + std::to_string(sms) + " SMs: the GPU has " +
                std::to_string(all.sm.smCount) + "; give 1 to " +
                std::to_string(all.sm.smCount - 1));
  CUdevResource first{}, rest{};
  unsigned groups = 1;
  check(g.split_by_count(&first, &groups, &all, &rest, 0, static_cast<unsigned>(sms)),
        "cuDevSmResourceSplitByCount");
  if (groups != 1 || rest.sm.smCount == 0)
    throw Error("an SM share of " + std::to_string(sms) + " SMs leaves none for the rest (" +
                std::to_string(first.sm.smCount) + " of " + std::to_string(all.sm.smCount) +
                " after rounding)");
  return {SmPartition(green_context(dev, first), static_cast<int>(first.sm.smCount)),
          SmPartition(green_context(dev, rest), static_cast<int>(rest.sm.smCount))};
}

SmPartition::~SmPartition() {
  if (ctx_) api().destroy(ctx_);
}

cudaStream_t SmPartition::create_stream(int priority) const {
  CUstream s = nullptr;
  check(api().stream_create(&s, ctx_, CU_STREAM_NON_BLOCKING, priority), "cuGreenCtxStreamCreate");
  return s;
}

}  // namespace deltaserve::cuda
