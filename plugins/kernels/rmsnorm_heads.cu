// RmsNormHeads: K RMSNorm'ed copies of each hidden state (one per drafter head), one read of the input.
//
// Why one kernel for all heads: MTP/Medusa-style heads all normalise the same final hidden state with
// their own weights. The sum of squares is shared, so reading x once and writing K outputs moves
// (1 + K) * T * H elements instead of 2 * K * T * H for K separate RMSNorms.
//
// Numerics are those of trtspec.models.llama.rms_norm: fp32 sum of squares, r = 1/sqrt(mean + eps),
// n = cast(x * r) to the I/O dtype, y = cast(w * n). Launch shapes:
//   H/vec <= 256    one warp per token, 4 tokens per block, warp-shuffle reduction only
//   H/vec <= 4096   one block (<= 512 threads) per token, the row in registers (128-bit loads), block reduction
//   otherwise, or H / strides / pointers not 16-byte friendly: a scalar block-per-token path.
// Grid y splits the heads into groups when the token blocks alone would not fill two waves of the GPU
// (decode sizes), and small grids use fewer vectors per thread (more threads per row).
#include "common.cuh"

namespace trtspec {
namespace {

struct RmsArgs {
    const void* x;
    int64_t x_row_stride;
    const void* w;
    int64_t w_head_stride;
    void* out;
    int64_t out_head_stride;
    int64_t out_token_stride;
    int32_t tokens;
    int32_t hidden;
    int32_t heads;
    float eps;
    int32_t heads_per_block;  // blockIdx.y handles heads [y * heads_per_block, (y + 1) * heads_per_block)
};

constexpr int kWarpRowsPerBlock = 4;
constexpr int kScalarThreads = 256;
// Block-per-token variant: at most 512 threads so a thread may keep 8 vectors of the row in registers.
constexpr int kMaxBlockThreads = 512;

// Block-wide sum for a 1-D block; every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float s_warp[32];
    __shared__ float s_total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) s_warp[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < static_cast<int>(blockDim.x >> 5) ? s_warp[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) s_total = t;
    }
    __syncthreads();
    return s_total;
}

__device__ __forceinline__ float inv_rms(float sum_sq, int hidden, float eps) {
    // Precise division and sqrt (no fast math): the reference computes rsqrt(mean + eps) in fp32.
    return 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
}

template <typename T, int VPT, bool kWarpPerRow>
__global__ void __launch_bounds__(kWarpPerRow ? 32 * kWarpRowsPerBlock : kMaxBlockThreads) rmsnorm_heads_vec_kernel(RmsArgs a) {
    constexpr int N = Vec16<T>::kSize;
    const int nvec = a.hidden / N;
    int row, pos, stride;
    if (kWarpPerRow) {
        row = blockIdx.x * kWarpRowsPerBlock + static_cast<int>(threadIdx.x >> 5);
        pos = threadIdx.x & 31;
        stride = 32;
        if (row >= a.tokens) return;  // whole warps leave; this variant has no block barrier
    } else {
        row = blockIdx.x;
        pos = threadIdx.x;
        stride = blockDim.x;
    }
    // __restrict__: x, w and out never overlap, so weight loads may be hoisted above earlier stores.
    const T* __restrict__ x = static_cast<const T*>(a.x) + static_cast<int64_t>(row) * a.x_row_stride;

    Vec16<T> v[VPT];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = pos + i * stride;
        if (j < nvec) {
            v[i] = load_vec(x + static_cast<int64_t>(j) * N);
#pragma unroll
            for (int e = 0; e < N; ++e) {
                const float f = to_float(v[i].v[e]);
                sum_sq += f * f;
            }
        }
    }
    sum_sq = kWarpPerRow ? warp_sum(sum_sq) : block_sum(sum_sq);
    const float r = inv_rms(sum_sq, a.hidden, a.eps);

    // n = cast(x * r), kept in the I/O dtype exactly as the reference rounds it.
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
#pragma unroll
        for (int e = 0; e < N; ++e) v[i].v[e] = from_float<T>(to_float(v[i].v[e]) * r);
    }

    const T* __restrict__ w = static_cast<const T*>(a.w);
    T* __restrict__ out = static_cast<T*>(a.out) + static_cast<int64_t>(row) * a.out_token_stride;
    const int k0 = static_cast<int>(blockIdx.y) * a.heads_per_block;
    const int k1 = min(a.heads, k0 + a.heads_per_block);
    for (int k = k0; k < k1; ++k) {
        const T* __restrict__ wk = w + static_cast<int64_t>(k) * a.w_head_stride;
        T* __restrict__ ok = out + static_cast<int64_t>(k) * a.out_head_stride;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int j = pos + i * stride;
            if (j < nvec) {
                const Vec16<T> wv = load_vec(wk + static_cast<int64_t>(j) * N);
                Vec16<T> y;
#pragma unroll
                for (int e = 0; e < N; ++e) y.v[e] = from_float<T>(to_float(wv.v[e]) * to_float(v[i].v[e]));
                store_vec(ok + static_cast<int64_t>(j) * N, y);
            }
        }
    }
}

// Any H, any alignment: two passes over the row (the second mostly hits L1/L2).
template <typename T>
__global__ void __launch_bounds__(kScalarThreads) rmsnorm_heads_scalar_kernel(RmsArgs a) {
    const int row = blockIdx.x;
    const T* x = static_cast<const T*>(a.x) + static_cast<int64_t>(row) * a.x_row_stride;
    float sum_sq = 0.0f;
    for (int h = threadIdx.x; h < a.hidden; h += blockDim.x) {
        const float f = to_float(x[h]);
        sum_sq += f * f;
    }
    sum_sq = block_sum(sum_sq);
    const float r = inv_rms(sum_sq, a.hidden, a.eps);
    const T* w = static_cast<const T*>(a.w);
    T* out = static_cast<T*>(a.out) + static_cast<int64_t>(row) * a.out_token_stride;
    const int k0 = static_cast<int>(blockIdx.y) * a.heads_per_block;
    const int k1 = min(a.heads, k0 + a.heads_per_block);
    for (int h = threadIdx.x; h < a.hidden; h += blockDim.x) {
        const float n = to_float(from_float<T>(to_float(x[h]) * r));
        for (int k = k0; k < k1; ++k) {
            const float wv = to_float(w[static_cast<int64_t>(k) * a.w_head_stride + h]);
            out[static_cast<int64_t>(k) * a.out_head_stride + h] = from_float<T>(wv * n);
        }
    }
}

template <typename T, bool kWarpPerRow>
void launch_vec(int vpt, const RmsArgs& a, int grid_x, int grid_y, int threads, cudaStream_t s) {
    switch (vpt) {
        case 1:
            launch_kernel_2d(rmsnorm_heads_vec_kernel<T, 1, kWarpPerRow>, grid_x, grid_y, threads, s, a);
            break;
        case 2:
            launch_kernel_2d(rmsnorm_heads_vec_kernel<T, 2, kWarpPerRow>, grid_x, grid_y, threads, s, a);
            break;
        case 4:
            launch_kernel_2d(rmsnorm_heads_vec_kernel<T, 4, kWarpPerRow>, grid_x, grid_y, threads, s, a);
            break;
        default:
            launch_kernel_2d(rmsnorm_heads_vec_kernel<T, 8, kWarpPerRow>, grid_x, grid_y, threads, s, a);
            break;
    }
}

// Head groups (grid y): when the token blocks alone fill fewer than two waves of the GPU, the heads are
// split over more blocks (each recomputes its row's sum of squares, a second read that hits L2), so decode
// sizes (T = 64) run on most SMs instead of a few with the heads serialised.
int head_groups(int row_blocks, int threads, int heads) {
    const int resident = device_info().sms * max(1, 2048 / max(threads, 32));
    const int target = 2 * resident;
    if (row_blocks >= target || heads <= 1) return 1;
    return min(heads, (target + row_blocks - 1) / row_blocks);
}

// Smallest vectors-per-thread (more threads per row, more loads in flight per SM) that fits the block.
int block_vpt(int nvec, bool small_grid) {
    if (small_grid) {
        for (int vpt : {1, 2, 4}) {
            if (nvec <= kMaxBlockThreads * vpt) return vpt;
        }
        return 8;
    }
    return nvec <= kMaxBlockThreads * 4 ? 4 : 8;
}

template <typename T>
int launch(RmsArgs a, cudaStream_t s) {
    constexpr int N = Vec16<T>::kSize;
    const bool vec_ok = a.hidden % N == 0 && a.x_row_stride % N == 0 && a.w_head_stride % N == 0 &&
                        a.out_head_stride % N == 0 && a.out_token_stride % N == 0 && aligned16(a.x) &&
                        aligned16(a.w) && aligned16(a.out);
    const int nvec = a.hidden / N;
    if (vec_ok && nvec <= 32 * 8) {
        const int vpt = nvec <= 32 ? 1 : nvec <= 64 ? 2 : nvec <= 128 ? 4 : 8;
        const int threads = 32 * kWarpRowsPerBlock;
        const int grid_x = (a.tokens + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
        const int groups = head_groups(grid_x, threads, a.heads);
        a.heads_per_block = (a.heads + groups - 1) / groups;
        launch_vec<T, true>(vpt, a, grid_x, (a.heads + a.heads_per_block - 1) / a.heads_per_block, threads, s);
    } else if (vec_ok && nvec <= kMaxBlockThreads * 8) {
        const bool small_grid = a.tokens < 2 * device_info().sms * 4;
        const int vpt = block_vpt(nvec, small_grid);
        const int threads = ((nvec + vpt - 1) / vpt + 31) / 32 * 32;
        const int groups = head_groups(a.tokens, threads, a.heads);
        a.heads_per_block = (a.heads + groups - 1) / groups;
        launch_vec<T, false>(vpt, a, a.tokens, (a.heads + a.heads_per_block - 1) / a.heads_per_block, threads, s);
    } else {
        const int groups = head_groups(a.tokens, kScalarThreads, a.heads);
        a.heads_per_block = (a.heads + groups - 1) / groups;
        launch_kernel_2d(rmsnorm_heads_scalar_kernel<T>, a.tokens, (a.heads + a.heads_per_block - 1) / a.heads_per_block,
                         kScalarThreads, s, a);
    }
    return launch_status();
}

}  // namespace
}  // namespace trtspec

extern "C" int trtspec_rmsnorm_heads(const void* x, int64_t x_row_stride, const void* weight,
                                     int64_t weight_head_stride, void* out, int64_t out_head_stride,
                                     int64_t out_token_stride, int32_t num_tokens, int32_t hidden,
                                     int32_t num_heads, float eps, int dtype, void* stream) {
    using namespace trtspec;
    if (hidden <= 0 || num_tokens < 0 || num_heads < 0 || x_row_stride < 0 || weight_head_stride < 0 ||
        out_head_stride < 0 || out_token_stride < 0) {
        return TRTSPEC_ERR_INVALID_ARGUMENT;
    }
    if (num_tokens == 0 || num_heads == 0) return TRTSPEC_OK;
    if (x == nullptr || weight == nullptr || out == nullptr) return TRTSPEC_ERR_INVALID_ARGUMENT;
    const RmsArgs a{x, x_row_stride, weight, weight_head_stride, out, out_head_stride, out_token_stride,
                    num_tokens, hidden, num_heads, eps, num_heads};
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (dtype) {
        case TRTSPEC_FLOAT32:
            return launch<float>(a, s);
        case TRTSPEC_FLOAT16:
            return launch<__half>(a, s);
        case TRTSPEC_BFLOAT16:
            return launch<__nv_bfloat16>(a, s);
        default:
            return TRTSPEC_ERR_INVALID_ARGUMENT;
    }
}

extern "C" int trtspec_rmsnorm_heads_layout(const void* x, const void* weight, void* out, int32_t num_tokens,
                                            int32_t hidden, int32_t num_heads, float eps, int dtype, int layout,
                                            void* stream) {
    const int64_t h = hidden;
    if (layout == TRTSPEC_LAYOUT_HEAD_MAJOR) {
        return trtspec_rmsnorm_heads(x, h, weight, h, out, static_cast<int64_t>(num_tokens) * h, h, num_tokens,
                                     hidden, num_heads, eps, dtype, stream);
    }
    if (layout == TRTSPEC_LAYOUT_TOKEN_MAJOR) {
        return trtspec_rmsnorm_heads(x, h, weight, h, out, h, static_cast<int64_t>(num_heads) * h, num_tokens,
                                     hidden, num_heads, eps, dtype, stream);
    }
    return TRTSPEC_ERR_INVALID_ARGUMENT;
}
