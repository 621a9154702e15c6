// Host emulation of the small part of CUDA the trtspec kernels use, so their real sources run on a CPU.
//
// Why: this project's CI has nvcc but no GPU. Compiled with g++ -DTRTSPEC_HOST_EMULATION, each kernel
// launch runs its blocks one after another; the threads of a block are cooperative fibers (ucontext),
// switched only at __syncthreads and at warp collectives (shuffles, ballots, __syncwarp). Because blocks
// run one at a time, `__shared__` can simply be `static`. The tests compare this build with the PyTorch
// reference, which checks the kernels' logic (indexing, reductions, the walk, the draws) without a GPU;
// speed, memory-model and real-hardware questions are left to the GPU tests.
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__

struct uint4 {
    unsigned int x, y, z, w;
};

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

typedef void* cudaStream_t;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

// ------------------------------------------------------------------ 16-bit floats (round to nearest even)
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __half2float(__half h) {
    _Float16 f;
    std::memcpy(&f, &h.bits, 2);
    return static_cast<float>(f);
}
inline __half __float2half_rn(float v) {
    _Float16 f = static_cast<_Float16>(v);
    __half h;
    std::memcpy(&h.bits, &f, 2);
    return h;
}
inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = static_cast<uint32_t>(b.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
        b.bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return b;
}

// ------------------------------------------------------------------ integer/float helpers CUDA provides
template <typename T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
    return a < b ? b : a;
}
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
inline int __ffs(unsigned int x) { return __builtin_ffs(static_cast<int>(x)); }
inline int atomicMin(int* p, int v) {  // fibers never interleave inside it
    const int old = *p;
    if (v < old) *p = v;
    return old;
}

namespace trtspec_emu {

extern dim3 g_thread_idx, g_block_idx, g_block_dim, g_grid_dim;

// Runs body() once per thread of a block of `threads` fibers (threadIdx set per fiber).
void run_block(int threads, const std::function<void()>& body);
void sync_block();
void sync_warp();
// Slot exchange for warp collectives: each lane publishes 8 bytes, then reads lane `src`'s.
uint64_t warp_exchange(uint64_t mine, int src);
unsigned int warp_ballot(bool pred);

template <typename K, typename... Args>
void launch(K kernel, int grid_x, int grid_y, int block, Args... args) {
    g_grid_dim.x = static_cast<unsigned int>(grid_x);
    g_grid_dim.y = static_cast<unsigned int>(grid_y);
    g_block_dim.x = static_cast<unsigned int>(block);
    for (int y = 0; y < grid_y; ++y) {
        for (int b = 0; b < grid_x; ++b) {
            g_block_idx.x = static_cast<unsigned int>(b);
            g_block_idx.y = static_cast<unsigned int>(y);
            run_block(block, [&] { kernel(args...); });
        }
    }
}

template <typename T>
inline T exchange(T v, int src) {
    static_assert(sizeof(T) <= 8, "warp collectives move at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = warp_exchange(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

}  // namespace trtspec_emu

#define threadIdx (::trtspec_emu::g_thread_idx)
#define blockIdx (::trtspec_emu::g_block_idx)
#define blockDim (::trtspec_emu::g_block_dim)
#define gridDim (::trtspec_emu::g_grid_dim)

inline void __syncthreads() { trtspec_emu::sync_block(); }
inline void __syncwarp(unsigned int = 0xffffffffu) { trtspec_emu::sync_warp(); }

template <typename T>
inline T __shfl_sync(unsigned int, T v, int src) {
    return trtspec_emu::exchange(v, src & 31);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int, T v, int mask) {
    return trtspec_emu::exchange(v, static_cast<int>((threadIdx.x & 31u) ^ static_cast<unsigned int>(mask)));
}
template <typename T>
inline T __shfl_up_sync(unsigned int, T v, unsigned int delta) {
    const int lane = static_cast<int>(threadIdx.x & 31u);
    const int src = lane - static_cast<int>(delta);
    const T other = trtspec_emu::exchange(v, src < 0 ? lane : src);
    return other;
}
inline unsigned int __ballot_sync(unsigned int, bool pred) { return trtspec_emu::warp_ballot(pred); }
inline bool __any_sync(unsigned int, bool pred) { return trtspec_emu::warp_ballot(pred) != 0u; }
