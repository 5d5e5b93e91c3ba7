// status.cu: status strings, API version and the last CUDA error (thread-local).
#include <cuda_runtime.h>

#include "common.cuh"

namespace wide {
namespace {
thread_local cudaError_t g_last_cuda = cudaSuccess;
}
void set_last_cuda_error(cudaError_t err) { g_last_cuda = err; }
}  // namespace wide

extern "C" const char* wide_status_string(int status) {
  switch (status) {
    case WIDE_OK: return "ok";
    case WIDE_ERR_INVALID_ARGUMENT: return "invalid argument (shape, stride, pointer or group size)";
    case WIDE_ERR_UNSUPPORTED_DTYPE: return "unsupported dtype (expected float32, float16 or bfloat16)";
    case WIDE_ERR_WORKSPACE_TOO_SMALL: return "workspace too small (see the *_workspace_size query)";
    case WIDE_ERR_CUDA: return "CUDA error (see wide_last_cuda_error_string)";
    default: return "unknown status";
  }
}

extern "C" int wide_kernels_api_version(void) { return WIDE_KERNELS_API_VERSION; }

extern "C" const char* wide_last_cuda_error_string(void) {
  return wide::g_last_cuda == cudaSuccess ? "no CUDA error" : cudaGetErrorString(wide::g_last_cuda);
}
