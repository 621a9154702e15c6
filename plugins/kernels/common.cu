// The library-wide C entry points that are not kernels: ABI version, status strings, last CUDA error.
#include "common.cuh"

namespace trtspec {
namespace {
thread_local const char* g_last_cuda_error = "no error";
}  // namespace

void set_last_cuda_error(cudaError_t err) { g_last_cuda_error = cudaGetErrorString(err); }

DeviceInfo device_info() {
#ifdef TRTSPEC_HOST_EMULATION
    return DeviceInfo{1, 0};
#else
    constexpr int kMaxDevices = 64;
    static DeviceInfo cache[kMaxDevices] = {};  // sms == 0: not asked yet (benign race: same answer)
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return DeviceInfo{1, 0};
    if (cache[dev].sms == 0) {
        int sms = 0, major = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || sms <= 0) {
            return DeviceInfo{1, 0};
        }
        cache[dev] = DeviceInfo{sms, major};
    }
    return cache[dev];
#endif
}

}  // namespace trtspec

extern "C" {

int trtspec_kernels_abi_version(void) { return TRTSPEC_KERNELS_ABI_VERSION; }

const char* trtspec_status_string(int status) {
    switch (status) {
        case TRTSPEC_OK:
            return "ok";
        case TRTSPEC_ERR_INVALID_ARGUMENT:
            return "invalid argument";
        case TRTSPEC_ERR_UNSUPPORTED:
            return "unsupported";
        case TRTSPEC_ERR_CUDA:
            return "CUDA error";
        default:
            return "unknown status";
    }
}

const char* trtspec_last_cuda_error(void) { return trtspec::g_last_cuda_error; }

}  // extern "C"
