// Shared device helpers for the trtspec kernels: dtype conversion, 128-bit vectors, warp reductions.
#pragma once

#ifdef TRTSPEC_HOST_EMULATION
// Host-only build that runs the kernels on the CPU (tests without a GPU): see plugins/emu/cuda_host_emu.h.
#include "../emu/cuda_host_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "trtspec_kernels.h"

namespace trtspec {

// Records the CUDA error of the last failed launch in this thread (trtspec_last_cuda_error reads it).
void set_last_cuda_error(cudaError_t err);

// Checks the launch just issued; turns a CUDA error into TRTSPEC_ERR_CUDA.
inline int launch_status() {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        set_last_cuda_error(err);
        return TRTSPEC_ERR_CUDA;
    }
    return TRTSPEC_OK;
}

// Launches kernel<<<grid, block, 0, stream>>>(args...); under TRTSPEC_HOST_EMULATION it runs on the CPU.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), int grid, int block, cudaStream_t stream, Args&&... args) {
#ifdef TRTSPEC_HOST_EMULATION
    trtspec_emu::launch(kernel, grid, 1, block, static_cast<Params>(args)...);
    (void)stream;
#else
    kernel<<<grid, block, 0, stream>>>(static_cast<Params>(args)...);
#endif
}

// The same with a 2-D grid (grid_x, grid_y).
template <typename... Params, typename... Args>
void launch_kernel_2d(void (*kernel)(Params...), int grid_x, int grid_y, int block, cudaStream_t stream,
                      Args&&... args) {
#ifdef TRTSPEC_HOST_EMULATION
    trtspec_emu::launch(kernel, grid_x, grid_y, block, static_cast<Params>(args)...);
    (void)stream;
#else
    kernel<<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), block, 0, stream>>>(
        static_cast<Params>(args)...);
#endif
}

// The current device's SM count and compute capability (cached per device; launch-shape heuristics).
// Where no device answers (no driver, or the host emulation) {sms = 1, major = 0}: the launch itself then
// reports any CUDA error.
struct DeviceInfo {
    int sms;
    int major;
};
DeviceInfo device_info();

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round-to-nearest-even, as torch's .to(dtype) does.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// 16 bytes of T: the unit of every vectorised load and store (one LDG.128 / STG.128).
template <typename T>
struct alignas(16) Vec16 {
    static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
    T v[kSize];
};

template <typename T>
__device__ __forceinline__ Vec16<T> load_vec(const T* p) {
    Vec16<T> out;
    *reinterpret_cast<uint4*>(&out) = __ldg(reinterpret_cast<const uint4*>(p));
    return out;
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec16<T>& v) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace trtspec
