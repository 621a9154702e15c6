// TreeVerify: which draft-tree tokens the target accepts, per sequence, on the GPU.
//
// The semantics are trtspec/runtime/verify.py, step for step (that module's docstring is the spec):
//   greedy   walk from the root; accept the first child (ascending node index = rank order) whose token
//            equals the target's argmax at the current node; the bonus is the argmax at the last node.
//   sampling at node cur with target distribution p, try the children in order; accept child c with token
//            t when u(c, 0) < p[t] / sum(p), else zero p[t] and try the next; when none is accepted (or
//            cur is a leaf) draw the bonus from the residual p by inverse CDF with u(cur, 1).
// u(node, slot) is the splitmix64 counter generator `counter_uniform` (24-bit mantissa, so it is the
// same number in fp32, fp64 and Python).
//
// One block per sequence, or (logits and probability modes on sm_90+) one thread block cluster of up to
// 8 CTAs per sequence: every CTA of the cluster keeps the tree and runs the same walk, but each reads only
// its 1/C slice of every visited row; the per-row results (argmax, max, tile sums) meet in distributed
// shared memory at one cluster barrier per reduction. So a 128k-vocabulary row is read by C SMs at once
// and batch 64 fills the GPU instead of 64 SMs. The tree (parents derived from the paths, the node tokens)
// lives in shared memory. Logits rows are only read at the nodes the walk visits (depth + 1 rows per sequence, not
// N + 1): one pass for argmax, or max + sum passes for the softmax. The sum pass also leaves per-tile
// sums in shared memory so the inverse-CDF draw reads only one tile of the row again.
#include <cfloat>
#include <climits>
#include <cstdlib>

#include "common.cuh"

#ifndef TRTSPEC_HOST_EMULATION
#include <cooperative_groups.h>
#endif

// Thread block clusters (distributed shared memory) exist from sm_90 on; elsewhere a "cluster" is one CTA.
#if !defined(TRTSPEC_HOST_EMULATION) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define TRTSPEC_CLUSTERS 1
#else
#define TRTSPEC_CLUSTERS 0
#endif

namespace trtspec {
namespace {

constexpr int kMaxNodes = TRTSPEC_MAX_TREE_NODES;
constexpr int kTileBase = 256;   // elements per warp step: 32 lanes x 8 consecutive elements
constexpr int kMaxTiles = 2048;  // tile sums kept in shared memory (16 KiB of doubles)
constexpr int kIdsThreads = 128;
constexpr int kLogitsThreads = 512;
// 16-byte vector loads each thread issues before it consumes any (bytes in flight per SM = 512 threads x
// kInFlight x 16 B = 64 KiB): a row streams at memory bandwidth instead of one load's latency per step.
constexpr int kInFlight = 8;
// Tiles a warp loads before it sums any of them (row_stats' sum pass).
constexpr int kTilesInFlight = 4;
// Largest cluster (CTAs per sequence): the portable cluster size.
constexpr int kMaxCluster = 8;

struct VerifyArgs {
    const int32_t* paths;
    int32_t num_paths;
    int32_t path_len;
    const int32_t* draft;
    int32_t num_nodes;
    const int32_t* target_ids;
    const void* target;
    int32_t vocab;
    bool vec_ok;        // target rows are 16-byte aligned and vocab % 8 == 0
    int32_t tile_mult;  // a tile is kTileBase * tile_mult elements
    int32_t num_tiles;
    const float* temperature;
    const int64_t* seed;
    int32_t seed_len;   // 1: (seed), 2: (seed, step)
    int32_t cluster;    // CTAs per sequence (1..kMaxCluster); blockIdx.x = sequence * cluster + rank
    int32_t* accepted_len;
    int32_t* out_tokens;
    int32_t* best_path;
    int32_t* keep_nodes;
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The key of one verification step: seed advanced `step` times along the splitmix64 sequence (seed_len 2),
// so a constant seed with a step counter gives fresh uniforms every step; step 0 is the seed itself.
__device__ __forceinline__ uint64_t step_key(const int64_t* seed, int32_t seed_len) {
    const uint64_t s = static_cast<uint64_t>(seed[0]);
    const uint64_t step = seed_len > 1 ? static_cast<uint64_t>(seed[1]) : 0ull;
    return s + step * 0x9E3779B97F4A7C15ull;
}

// counter_uniform(seed, batch, node, slot) of trtspec/runtime/verify.py.
__device__ __forceinline__ double counter_uniform(uint64_t seed, uint64_t batch, uint64_t node, uint64_t slot) {
    const uint64_t counter = (batch << 20) + (node << 2) + slot;
    const uint64_t h = splitmix64(splitmix64(seed) ^ counter);
    return static_cast<double>(h >> 40) / 16777216.0;
}

// torch.argmax order: NaN beats everything, larger beats smaller, ties go to the lower index.
__device__ __forceinline__ bool argmax_better(float v, int i, float best_v, int best_i) {
    const bool nan_v = v != v;
    const bool nan_b = best_v != best_v;
    if (nan_v || nan_b) return nan_v && (!nan_b || i < best_i);
    return v > best_v || (v == best_v && i < best_i);
}

// Eight consecutive elements of a row starting at `j` (a multiple of 8) as floats; `n` valid ones.
template <typename TT>
__device__ __forceinline__ int load8(const TT* row, int64_t j, int vocab, bool vec_ok, float (&f)[8]) {
    const int n = static_cast<int>(min(static_cast<int64_t>(8), static_cast<int64_t>(vocab) - j));
    if (vec_ok && n == 8) {
        constexpr int N = Vec16<TT>::kSize;
#pragma unroll
        for (int part = 0; part < 8 / N; ++part) {
            const Vec16<TT> v = load_vec(row + j + part * N);
#pragma unroll
            for (int e = 0; e < N; ++e) f[part * N + e] = to_float(v.v[e]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = e < n ? to_float(row[j + e]) : 0.0f;
    }
    return n;
}

// ------------------------------------------------------------------ clusters
__device__ __forceinline__ int cluster_rank(const VerifyArgs& a) { return static_cast<int>(blockIdx.x) % a.cluster; }

// [lo, hi) of `count` items that this CTA of the cluster owns (contiguous slices, rank order).
__device__ __forceinline__ void cluster_slice(const VerifyArgs& a, int64_t count, int64_t& lo, int64_t& hi) {
    const int64_t per = (count + a.cluster - 1) / a.cluster;
    lo = min(count, per * cluster_rank(a));
    hi = min(count, lo + per);
}

// Barrier of the whole cluster (a block barrier when the cluster is one CTA). Release/acquire: shared-memory
// stores made into any CTA of the cluster before it are visible to every CTA after it.
__device__ __forceinline__ void cluster_barrier(const VerifyArgs& a) {
#if TRTSPEC_CLUSTERS
    if (a.cluster > 1) {
        cooperative_groups::this_cluster().sync();
        return;
    }
#endif
    (void)a;
    __syncthreads();
}

// slots[index] = v in every CTA of the cluster (distributed shared memory stores), or locally.
template <typename T>
__device__ __forceinline__ void cluster_store_all(const VerifyArgs& a, T* slots, int index, T v) {
#if TRTSPEC_CLUSTERS
    if (a.cluster > 1) {
        cooperative_groups::cluster_group c = cooperative_groups::this_cluster();
        for (int q = 0; q < a.cluster; ++q) c.map_shared_rank(slots, q)[index] = v;
        return;
    }
#endif
    (void)a;
    slots[index] = v;
}

template <int NT>
__device__ __forceinline__ int block_min_int(int v, int* s_scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) s_scratch[warp] = v;
    __syncthreads();
    int r = INT_MAX;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) r = min(r, s_scratch[w]);
    __syncthreads();
    return r;
}

template <int NT>
__device__ __forceinline__ float block_max(float v, float* s_scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) s_scratch[warp] = v;
    __syncthreads();
    float r = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) r = fmaxf(r, s_scratch[w]);
    __syncthreads();
    return r;
}

template <int NT>
__device__ __forceinline__ double block_sum_double(double v, double* s_scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) s_scratch[warp] = v;
    __syncthreads();
    double r = 0.0;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) r += s_scratch[w];  // fixed order: deterministic
    __syncthreads();
    return r;
}

// Folds the elements of one 16-byte vector starting at index j0 into a running argmax.
template <typename TT>
__device__ __forceinline__ void argmax_fold(const Vec16<TT>& v, int64_t j0, float& best, int& bi) {
#pragma unroll
    for (int e = 0; e < Vec16<TT>::kSize; ++e) {
        const float f = to_float(v.v[e]);
        const int idx = static_cast<int>(j0 + e);
        if (argmax_better(f, idx, best, bi)) {
            best = f;
            bi = idx;
        }
    }
}

// argmax over one row, every thread gets the index. Vector path: kInFlight 16-byte loads per thread are
// issued before any is consumed (the order of consumption does not matter: ties go to the lower index).
template <typename TT, int NT>
__device__ int block_argmax(const TT* row, const VerifyArgs& a, int& parity) {
    __shared__ float s_v[NT / 32];
    __shared__ int s_i[NT / 32];
    __shared__ float s_cv[2][kMaxCluster];  // per-CTA results of the cluster, double-buffered by parity
    __shared__ int s_ci[2][kMaxCluster];
    float best = -INFINITY;
    int bi = INT_MAX;
    if (a.vec_ok) {
        constexpr int N = Vec16<TT>::kSize;
        int64_t lo, hi;  // this CTA's vectors; vec_ok: vocab % 8 == 0, so no tail
        cluster_slice(a, a.vocab / N, lo, hi);
        for (int64_t base = lo + threadIdx.x; base < hi; base += static_cast<int64_t>(NT) * kInFlight) {
            Vec16<TT> v[kInFlight];
#pragma unroll
            for (int u = 0; u < kInFlight; ++u) {
                const int64_t c = base + static_cast<int64_t>(u) * NT;
                if (c < hi) v[u] = load_vec(row + c * N);
            }
#pragma unroll
            for (int u = 0; u < kInFlight; ++u) {
                const int64_t c = base + static_cast<int64_t>(u) * NT;
                if (c < hi) argmax_fold(v[u], c * N, best, bi);
            }
        }
    } else {
        int64_t lo, hi;
        cluster_slice(a, a.vocab, lo, hi);
        for (int64_t j = lo + threadIdx.x; j < hi; j += NT) {
            const float f = to_float(row[j]);
            if (argmax_better(f, static_cast<int>(j), best, bi)) {
                best = f;
                bi = static_cast<int>(j);
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (argmax_better(ov, oi, best, bi)) {
            best = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_v[warp] = best;
        s_i[warp] = bi;
    }
    __syncthreads();
    best = s_v[0];
    bi = s_i[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) {
        if (argmax_better(s_v[w], s_i[w], best, bi)) {
            best = s_v[w];
            bi = s_i[w];
        }
    }
    __syncthreads();
    if (a.cluster > 1) {  // combine the CTAs' slices in rank order: the same answer in every CTA
        const int par = parity;
        parity ^= 1;
        if (threadIdx.x == 0) {
            cluster_store_all(a, s_cv[par], cluster_rank(a), best);
            cluster_store_all(a, s_ci[par], cluster_rank(a), bi);
        }
        cluster_barrier(a);
        best = s_cv[par][0];
        bi = s_ci[par][0];
        for (int q = 1; q < a.cluster; ++q) {
            if (argmax_better(s_cv[par][q], s_ci[par][q], best, bi)) {
                best = s_cv[par][q];
                bi = s_ci[par][q];
            }
        }
    }
    return bi == INT_MAX ? 0 : bi;
}

// max over one row of x / temp (the softmax shift), every thread gets it; loads in flight as in block_argmax.
template <typename TT, int NT>
__device__ float block_row_max(const TT* row, const VerifyArgs& a, float temp, float* s_scratch) {
    __shared__ float s_cm[kMaxCluster];  // one max per CTA of the cluster (the tile pass barrier separates uses)
    float mx = -FLT_MAX;
    if (a.vec_ok) {
        constexpr int N = Vec16<TT>::kSize;
        int64_t lo, hi;
        cluster_slice(a, a.vocab / N, lo, hi);
        for (int64_t base = lo + threadIdx.x; base < hi; base += static_cast<int64_t>(NT) * kInFlight) {
            Vec16<TT> v[kInFlight];
#pragma unroll
            for (int u = 0; u < kInFlight; ++u) {
                const int64_t c = base + static_cast<int64_t>(u) * NT;
                if (c < hi) v[u] = load_vec(row + c * N);
            }
#pragma unroll
            for (int u = 0; u < kInFlight; ++u) {
                const int64_t c = base + static_cast<int64_t>(u) * NT;
                if (c < hi) {
#pragma unroll
                    for (int e = 0; e < N; ++e) mx = fmaxf(mx, to_float(v[u].v[e]) / temp);
                }
            }
        }
    } else {
        int64_t lo, hi;
        cluster_slice(a, a.vocab, lo, hi);
        for (int64_t j = lo + threadIdx.x; j < hi; j += NT) mx = fmaxf(mx, to_float(row[j]) / temp);
    }
    mx = block_max<NT>(mx, s_scratch);
    if (a.cluster > 1) {
        if (threadIdx.x == 0) cluster_store_all(a, s_cm, cluster_rank(a), mx);
        cluster_barrier(a);
        mx = s_cm[0];
        for (int q = 1; q < a.cluster; ++q) mx = fmaxf(mx, s_cm[q]);
    }
    return mx;
}

// p[j] up to a common factor: exp(x/temp - m) for logits, x itself for probabilities.
template <bool kLogits>
__device__ __forceinline__ float pvalue(float x, float temp, float m) {
    return kLogits ? expf(x / temp - m) : x;
}

// One lane's part of a tile sum: its 8 elements of each of the tile's tile_mult steps, rejected tokens
// zeroed, accumulated in a fixed order. `f`/`n` are the already loaded elements of step 0 when `pre` is set
// (row_stats loads several tiles ahead); the result does not depend on whether they were.
template <typename TT, bool kLogits>
__device__ __forceinline__ double lane_tile_sum(const TT* row, const VerifyArgs& a, int tile, float temp, float m,
                                                const int* s_rej, int nrej, bool pre, const float (&f0)[8],
                                                int n0) {
    const int lane = threadIdx.x & 31;
    const int64_t tile_elems = static_cast<int64_t>(kTileBase) * a.tile_mult;
    double acc = 0.0;
    for (int s = 0; s < a.tile_mult; ++s) {
        const int64_t j = tile * tile_elems + static_cast<int64_t>(s) * kTileBase + lane * 8;
        if (j < a.vocab) {
            float f[8];
            int n;
            if (pre && s == 0) {
                n = n0;
#pragma unroll
                for (int e = 0; e < 8; ++e) f[e] = f0[e];
            } else {
                n = load8(row, j, a.vocab, a.vec_ok, f);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                bool zero = e >= n;
                for (int r = 0; r < nrej; ++r) zero |= s_rej[r] == j + e;
                if (!zero) acc += static_cast<double>(pvalue<kLogits>(f[e], temp, m));
            }
        }
    }
    return acc;
}

// Sum of p over one tile with the rejected tokens zeroed, in a fixed order (lane-wise, then the warp):
// row_stats and the draw's recomputation give bit-identical sums for an untouched tile. Whole warp calls.
template <typename TT, bool kLogits>
__device__ double tile_sum(const TT* row, const VerifyArgs& a, int tile, float temp, float m, const int* s_rej,
                           int nrej) {
    const float none[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    return warp_sum(lane_tile_sum<TT, kLogits>(row, a, tile, temp, m, s_rej, nrej, false, none, 0));
}

// Softmax statistics of one row (max of x/temp for logits, and the sum of p) plus the per-tile sums of p
// in s_tile for the inverse-CDF draw. Each CTA of a cluster sums its slice of the tiles (warp-strided; a
// warp loads the first step of kTilesInFlight tiles before it sums any) and stores every tile sum into all
// CTAs' s_tile; after the barrier each CTA adds up the same s_tile in the same order, so every CTA holds
// the same total and the same tile sums.
template <typename TT, int NT, bool kLogits>
__device__ double row_stats(const TT* row, const VerifyArgs& a, float temp, float* m_out, double* s_tile) {
    __shared__ float s_f[NT / 32];
    __shared__ double s_d[NT / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m = 0.0f;
    if constexpr (kLogits) {
        m = block_row_max<TT, NT>(row, a, temp, s_f);  // ends with a cluster barrier when clustered
    } else if (a.cluster > 1) {
        cluster_barrier(a);  // every CTA is done with the previous row's s_tile before it is overwritten
    }
    const int64_t tile_elems = static_cast<int64_t>(kTileBase) * a.tile_mult;
    int64_t lo, hi;
    cluster_slice(a, a.num_tiles, lo, hi);
    for (int64_t t0 = lo + warp; t0 < hi; t0 += (NT / 32) * kTilesInFlight) {
        float f[kTilesInFlight][8];
        int n[kTilesInFlight];
#pragma unroll
        for (int u = 0; u < kTilesInFlight; ++u) {
            const int64_t t = t0 + u * (NT / 32);
            const int64_t j = t * tile_elems + lane * 8;
            n[u] = 0;
            if (t < hi && j < a.vocab) {
                n[u] = load8(row, j, a.vocab, a.vec_ok, f[u]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) f[u][e] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < kTilesInFlight; ++u) {
            const int t = static_cast<int>(t0 + u * (NT / 32));
            if (t < hi) {  // warp-uniform
                const double acc =
                    warp_sum(lane_tile_sum<TT, kLogits>(row, a, t, temp, m, nullptr, 0, true, f[u], n[u]));
                if (lane == 0) cluster_store_all(a, s_tile, t, acc);
            }
        }
    }
    cluster_barrier(a);
    double total = 0.0;
    if (lane == 0) {
        for (int t = warp; t < a.num_tiles; t += NT / 32) total += s_tile[t];
    }
    total = block_sum_double<NT>(total, s_d);
    *m_out = m;
    return total;
}

// Inverse-CDF draw over the residual row (rejected tokens zeroed): the first j whose inclusive cumulative
// sum exceeds u * total, like torch.searchsorted(cumsum, u * cumsum[-1], right=True) clamped to V - 1.
template <typename TT, int NT, bool kLogits>
__device__ int draw_bonus(const TT* row, const VerifyArgs& a, float temp, float m, double u, double* s_tile,
                          const int* s_rej, int nrej) {
    __shared__ double s_scan[NT / 32];
    __shared__ int s_tile_hit;
    __shared__ double s_tile_before;
    __shared__ int s_result;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t tile_elems = static_cast<int64_t>(kTileBase) * a.tile_mult;
    if (warp == 0) {
        // Tiles holding a rejected token are summed again without it (exactly 0 when it was all their mass).
        for (int r = 0; r < nrej; ++r) {
            const int t = static_cast<int>(s_rej[r] / tile_elems);
            bool again = false;
            for (int q = 0; q < r; ++q) again |= static_cast<int>(s_rej[q] / tile_elems) == t;
            if (!again) {
                const double sum = tile_sum<TT, kLogits>(row, a, t, temp, m, s_rej, nrej);
                if (lane == 0) s_tile[t] = sum;
            }
        }
        if (lane == 0) {
            s_tile_hit = INT_MAX;
            s_result = a.vocab - 1;
        }
    }
    __syncthreads();
    // Each thread owns a contiguous run of tiles; an exclusive block scan gives each run's start.
    const int per = (a.num_tiles + NT - 1) / NT;
    const int t0 = threadIdx.x * per;
    const int t1 = min(t0 + per, a.num_tiles);
    double mine = 0.0;
    for (int t = t0; t < t1; ++t) mine += s_tile[t];
    double incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    if (lane == 31) s_scan[warp] = incl;
    __syncthreads();
    double warp_before = 0.0, total = 0.0;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) {
        if (w < warp) warp_before += s_scan[w];
        total += s_scan[w];
    }
    const double target = u * total;
    double run = warp_before + incl - mine;
    int hit = INT_MAX;
    double before = 0.0;
    if (total > 0.0) {
        for (int t = t0; t < t1; ++t) {
            if (run + s_tile[t] > target) {
                hit = t;
                before = run;
                break;
            }
            run += s_tile[t];
        }
    }
    if (hit != INT_MAX) atomicMin(&s_tile_hit, hit);
    __syncthreads();
    const int tile = s_tile_hit;
    if (hit != INT_MAX && hit == tile) s_tile_before = before;
    __syncthreads();
    if (tile != INT_MAX && warp == 0) {
        double rem = target - s_tile_before;
        bool done = false;
        for (int s = 0; s < a.tile_mult && !done; ++s) {
            const int64_t j = tile * tile_elems + static_cast<int64_t>(s) * kTileBase + lane * 8;
            float p[8];
            int n = 0;
            if (j < a.vocab) {
                float f[8];
                n = load8(row, j, a.vocab, a.vec_ok, f);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    p[e] = e < n ? pvalue<kLogits>(f[e], temp, m) : 0.0f;
                    for (int r = 0; r < nrej; ++r)
                        if (s_rej[r] == j + e) p[e] = 0.0f;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) p[e] = 0.0f;
            }
            double lsum = 0.0;
#pragma unroll
            for (int e = 0; e < 8; ++e) lsum += static_cast<double>(p[e]);
            double lincl = lsum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const double up = __shfl_up_sync(0xffffffffu, lincl, o);
                if (lane >= o) lincl += up;
            }
            const unsigned crossing = __ballot_sync(0xffffffffu, lincl > rem);
            if (crossing != 0u) {
                const int l = __ffs(crossing) - 1;
                if (lane == l) {
                    double c = lincl - lsum;
                    int pick = static_cast<int>(j) + max(n, 1) - 1;
                    for (int e = 0; e < n; ++e) {
                        c += static_cast<double>(p[e]);
                        if (c > rem) {
                            pick = static_cast<int>(j) + e;
                            break;
                        }
                    }
                    s_result = pick;
                }
                done = true;
            } else {
                rem -= __shfl_sync(0xffffffffu, lincl, 31);
            }
        }
        if (!done && lane == 0) {
            s_result = static_cast<int>(min(static_cast<int64_t>(a.vocab), (tile + 1) * tile_elems) - 1);
        }
    }
    __syncthreads();
    const int r = s_result;
    __syncthreads();
    return r;
}

template <typename TT, int MODE, int NT>
__global__ void __launch_bounds__(NT) tree_verify_kernel(VerifyArgs a) {
    constexpr bool kSampling = MODE == TRTSPEC_VERIFY_SAMPLE_LOGITS || MODE == TRTSPEC_VERIFY_SAMPLE_PROBS;
    constexpr bool kLogits = MODE == TRTSPEC_VERIFY_SAMPLE_LOGITS;
    __shared__ int s_parent[kMaxNodes];
    __shared__ int s_tok[kMaxNodes];
    __shared__ int s_tgt[MODE == TRTSPEC_VERIFY_GREEDY_IDS ? kMaxNodes : 1];
    __shared__ int s_acc[kMaxNodes];
    __shared__ int s_rej[kSampling ? kMaxNodes : 1];
    __shared__ double s_tile[kSampling ? kMaxTiles : 1];
    __shared__ int s_scratch[NT / 32];
    __shared__ int s_step[2];

    const int b = static_cast<int>(blockIdx.x) / a.cluster;  // the sequence; every CTA of its cluster walks
    const bool leader = cluster_rank(a) == 0;                 // only the cluster's rank 0 writes the outputs
    const int tid = threadIdx.x;
    const int N1 = a.num_nodes, L = a.path_len, P = a.num_paths;
    int parity = 0;
    const int64_t row0 = static_cast<int64_t>(b) * N1;

    for (int i = tid; i < N1; i += NT) {
        s_parent[i] = -1;
        s_tok[i] = a.draft[row0 + i];
        if (MODE == TRTSPEC_VERIFY_GREEDY_IDS) s_tgt[i] = a.target_ids[row0 + i];
    }
    __syncthreads();
    // parents from the paths: each (path, depth >= 1) entry names its node's parent one slot earlier.
    for (int e = tid; e < P * L; e += NT) {
        if (e % L == 0) continue;
        const int n = a.paths[e], pn = a.paths[e - 1];
        if (n > 0 && n < N1 && pn >= 0 && pn < N1) s_parent[n] = pn;
    }
    __syncthreads();
    // Distributed shared memory may be touched only once every CTA of the cluster is running (CUDA
    // programming guide, "Distributed Shared Memory"): without this barrier a fast CTA's first
    // cluster_store_all can write into a peer that has not started (compute-sanitizer racecheck saw it).
    if (a.cluster > 1) cluster_barrier(a);

    const TT* target = static_cast<const TT*>(a.target);
    const uint64_t seed = kSampling ? step_key(a.seed, a.seed_len) : 0ull;
    float temp = 1.0f;
    if (kLogits && a.temperature != nullptr) temp = fmaxf(a.temperature[b], 1e-6f);

    int cur = 0, len = 0, bonus = 0;
    while (true) {
        const TT* row = target + (row0 + cur) * static_cast<int64_t>(a.vocab);
        if constexpr (!kSampling) {
            int want;
            if constexpr (MODE == TRTSPEC_VERIFY_GREEDY_IDS) {
                want = s_tgt[cur];
            } else {
                want = block_argmax<TT, NT>(row, a, parity);
            }
            int next = INT_MAX;
            if (len < L - 1) {
                for (int i = tid + 1; i < N1; i += NT)
                    if (s_parent[i] == cur && s_tok[i] == want) next = min(next, i);
                next = block_min_int<NT>(next, s_scratch);
            }
            if (next == INT_MAX) {
                bonus = want;
                break;
            }
            if (tid == 0) s_acc[len] = next;
            ++len;
            cur = next;
        } else {
            float m = 0.0f;
            const double S = row_stats<TT, NT, kLogits>(row, a, temp, &m, s_tile);
            // Children in rank order, decided one by one by warp 0 (each lane prefetches one child's p).
            if (tid < 32) {
                const int lane = tid;
                int accepted = -1, nrej = 0;
                double rej_sum = 0.0;
                if (len < L - 1) {
                    for (int base = 1; base < N1 && accepted < 0; base += 32) {
                        const int i = base + lane;
                        const bool child = i < N1 && s_parent[i] == cur;
                        unsigned mask = __ballot_sync(0xffffffffu, child);
                        int t_mine = -1;
                        double p_mine = 0.0;
                        if (child) {
                            t_mine = s_tok[i];
                            if (t_mine >= 0 && t_mine < a.vocab)
                                p_mine = static_cast<double>(pvalue<kLogits>(to_float(row[t_mine]), temp, m));
                        }
                        while (mask != 0u) {
                            const int l = __ffs(mask) - 1;
                            mask &= mask - 1u;
                            const int c = base + l;
                            const int t = __shfl_sync(0xffffffffu, t_mine, l);
                            const double p = __shfl_sync(0xffffffffu, p_mine, l);
                            bool seen = false;  // a token already zeroed keeps p = 0
                            for (int r = lane; r < nrej; r += 32) seen |= s_rej[r] == t;
                            seen = __any_sync(0xffffffffu, seen);
                            const double pt = seen ? 0.0 : p;
                            const double total = S - rej_sum;
                            if (total > 0.0 && counter_uniform(seed, b, c, 0) < pt / total) {
                                accepted = c;
                                break;
                            }
                            if (!seen && t >= 0 && t < a.vocab) {
                                if (lane == 0) s_rej[nrej] = t;
                                ++nrej;
                                rej_sum += p;
                                __syncwarp();
                            }
                        }
                    }
                }
                if (lane == 0) {
                    s_step[0] = accepted;
                    s_step[1] = nrej;
                }
            }
            __syncthreads();
            const int next = s_step[0];
            const int nrej = s_step[1];
            __syncthreads();
            if (next < 0) {
                bonus = draw_bonus<TT, NT, kLogits>(row, a, temp, m, counter_uniform(seed, b, cur, 1), s_tile,
                                                    s_rej, nrej);
                break;
            }
            if (tid == 0) s_acc[len] = next;
            ++len;
            cur = next;
        }
    }
    __syncthreads();

    if (leader) {
        const int64_t out0 = static_cast<int64_t>(b) * L;
        for (int i = tid; i < L; i += NT) {
            a.out_tokens[out0 + i] = i < len ? s_tok[s_acc[i]] : (i == len ? bonus : -1);
            a.keep_nodes[out0 + i] = i == 0 ? 0 : (i <= len ? s_acc[i - 1] : -1);
        }
        int best = INT_MAX;
        for (int p = tid; p < P; p += NT)
            if (a.paths[static_cast<int64_t>(p) * L + len] == cur) best = min(best, p);
        best = block_min_int<NT>(best, s_scratch);
        if (tid == 0) {
            a.accepted_len[b] = len;
            a.best_path[b] = best == INT_MAX ? -1 : best;
        }
    }
    if (a.cluster > 1) cluster_barrier(a);  // no CTA leaves while a peer may still touch its shared memory
}

// CTAs per sequence: the largest power of two <= kMaxCluster that keeps every CTA of the batch resident at
// once (`per_sm` CTAs of this kernel fit on an SM), on sm_90+ only. TRTSPEC_VERIFY_CLUSTER=1..8 overrides
// it (the tests and the benchmark compare the clustered kernel with the one-CTA-per-sequence one).
#ifndef TRTSPEC_HOST_EMULATION
int choose_cluster(int batch, int per_sm) {
    const DeviceInfo dev = device_info();
    if (dev.major < 9) return 1;
    if (char const* env = std::getenv("TRTSPEC_VERIFY_CLUSTER")) {
        const int want = std::atoi(env);
        if (want >= 1) {
            int c = 1;
            while (c * 2 <= min(want, kMaxCluster)) c *= 2;
            return c;
        }
    }
    const int64_t resident = static_cast<int64_t>(dev.sms) * max(per_sm, 1);
    int c = 1;
    while (c < kMaxCluster && static_cast<int64_t>(batch) * c * 2 <= resident) c *= 2;
    return c;
}
#endif

template <typename Kernel>
void launch_clustered(Kernel kernel, VerifyArgs a, int batch, cudaStream_t s) {
#ifndef TRTSPEC_HOST_EMULATION
    static int per_sm = -1;  // CTAs of this kernel per SM (registers decide); asked once per instantiation
    if (per_sm < 0 && device_info().major >= 9) {
        int n = 1;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kLogitsThreads, 0) != cudaSuccess) {
            (void)cudaGetLastError();
            n = 1;
        }
        per_sm = max(n, 1);
    }
    a.cluster = choose_cluster(batch, per_sm);
    if (a.cluster > 1) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(static_cast<unsigned>(batch) * static_cast<unsigned>(a.cluster));
        config.blockDim = dim3(kLogitsThreads);
        config.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = static_cast<unsigned>(a.cluster);
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        config.attrs = attr;
        config.numAttrs = 1;
        if (cudaLaunchKernelEx(&config, kernel, a) == cudaSuccess) return;
        (void)cudaGetLastError();  // e.g. no room for the cluster: fall back to one CTA per sequence
    }
#endif
    a.cluster = 1;
    launch_kernel(kernel, batch, kLogitsThreads, s, a);
}

template <typename TT>
int launch_typed(int mode, const VerifyArgs& a, int batch, cudaStream_t s) {
    switch (mode) {
        case TRTSPEC_VERIFY_GREEDY_LOGITS:
            launch_clustered(tree_verify_kernel<TT, TRTSPEC_VERIFY_GREEDY_LOGITS, kLogitsThreads>, a, batch, s);
            break;
        case TRTSPEC_VERIFY_SAMPLE_LOGITS:
            launch_clustered(tree_verify_kernel<TT, TRTSPEC_VERIFY_SAMPLE_LOGITS, kLogitsThreads>, a, batch, s);
            break;
        default:
            launch_clustered(tree_verify_kernel<TT, TRTSPEC_VERIFY_SAMPLE_PROBS, kLogitsThreads>, a, batch, s);
            break;
    }
    return launch_status();
}

}  // namespace
}  // namespace trtspec

extern "C" int trtspec_tree_verify(int mode, const int32_t* paths, int32_t num_paths, int32_t path_len,
                                   const int32_t* draft_tokens, int32_t batch, int32_t num_nodes,
                                   const int32_t* target_ids, const void* target, int target_dtype, int32_t vocab,
                                   const float* temperature, const int64_t* seed, int32_t seed_len,
                                   int32_t* accepted_len,
                                   int32_t* out_tokens, int32_t* best_path, int32_t* keep_nodes, void* stream) {
    using namespace trtspec;
    if (mode < TRTSPEC_VERIFY_GREEDY_IDS || mode > TRTSPEC_VERIFY_SAMPLE_PROBS) return TRTSPEC_ERR_INVALID_ARGUMENT;
    if (batch < 0 || num_nodes < 1 || path_len < 1 || path_len > num_nodes || num_paths < 1 ||
        num_paths > num_nodes) {
        return num_nodes > kMaxNodes ? TRTSPEC_ERR_UNSUPPORTED : TRTSPEC_ERR_INVALID_ARGUMENT;
    }
    if (num_nodes > kMaxNodes) return TRTSPEC_ERR_UNSUPPORTED;
    if (batch == 0) return TRTSPEC_OK;
    if (paths == nullptr || draft_tokens == nullptr || accepted_len == nullptr || out_tokens == nullptr ||
        best_path == nullptr || keep_nodes == nullptr) {
        return TRTSPEC_ERR_INVALID_ARGUMENT;
    }
    VerifyArgs a{};
    a.paths = paths;
    a.num_paths = num_paths;
    a.path_len = path_len;
    a.draft = draft_tokens;
    a.num_nodes = num_nodes;
    a.target_ids = target_ids;
    a.target = target;
    a.vocab = vocab;
    a.temperature = temperature;
    a.seed = seed;
    a.seed_len = seed_len;
    a.cluster = 1;
    a.accepted_len = accepted_len;
    a.out_tokens = out_tokens;
    a.best_path = best_path;
    a.keep_nodes = keep_nodes;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (mode == TRTSPEC_VERIFY_GREEDY_IDS) {
        if (target_ids == nullptr) return TRTSPEC_ERR_INVALID_ARGUMENT;
        launch_kernel(tree_verify_kernel<float, TRTSPEC_VERIFY_GREEDY_IDS, kIdsThreads>, batch, kIdsThreads, s,
                      a);
        return launch_status();
    }
    if (target == nullptr || vocab < 1) return TRTSPEC_ERR_INVALID_ARGUMENT;
    if (mode != TRTSPEC_VERIFY_GREEDY_LOGITS && (seed == nullptr || seed_len < 1 || seed_len > 2)) {
        return TRTSPEC_ERR_INVALID_ARGUMENT;
    }
    a.vec_ok = vocab % 8 == 0 && aligned16(target);
    const int64_t per_tile_max = static_cast<int64_t>(kTileBase) * kMaxTiles;
    a.tile_mult = static_cast<int32_t>((vocab + per_tile_max - 1) / per_tile_max);
    const int64_t tile_elems = static_cast<int64_t>(kTileBase) * a.tile_mult;
    a.num_tiles = static_cast<int32_t>((vocab + tile_elems - 1) / tile_elems);
    switch (target_dtype) {
        case TRTSPEC_FLOAT32:
            return launch_typed<float>(mode, a, batch, s);
        case TRTSPEC_FLOAT16:
            return launch_typed<__half>(mode, a, batch, s);
        case TRTSPEC_BFLOAT16:
            return launch_typed<__nv_bfloat16>(mode, a, batch, s);
        default:
            return TRTSPEC_ERR_INVALID_ARGUMENT;
    }
}
