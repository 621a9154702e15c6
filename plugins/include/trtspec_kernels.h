/*
 * trtspec CUDA kernels: the C ABI.
 *
 * Why a C ABI: the same kernels are called from the TensorRT plugins (C++), from Python through ctypes
 * (tests and benchmarks against the PyTorch reference) and from anything else that can dlopen a .so. The
 * header needs no CUDA headers (streams are passed as `void*`, i.e. a cudaStream_t), so it parses with a
 * plain C compiler.
 *
 * All pointers are device pointers unless a comment says otherwise. Every function is asynchronous on the
 * given stream and returns a trtspec_status; TRTSPEC_ERR_CUDA means the launch failed (see
 * trtspec_last_cuda_error()).
 */
#ifndef TRTSPEC_KERNELS_H
#define TRTSPEC_KERNELS_H

#include <stdint.h>

#if defined(_WIN32)
#define TRTSPEC_API __declspec(dllexport)
#else
#define TRTSPEC_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature or a semantic below changes; bindings refuse a library with another one. */
#define TRTSPEC_KERNELS_ABI_VERSION 2

/* Largest draft tree (nodes including the root) tree_verify handles; it keeps the tree in shared memory. */
#define TRTSPEC_MAX_TREE_NODES 1024

typedef enum trtspec_dtype {
    TRTSPEC_FLOAT32 = 0,
    TRTSPEC_FLOAT16 = 1,
    TRTSPEC_BFLOAT16 = 2
} trtspec_dtype;

typedef enum trtspec_status {
    TRTSPEC_OK = 0,
    TRTSPEC_ERR_INVALID_ARGUMENT = 1, /* a size, stride, pointer or enum value is out of range */
    TRTSPEC_ERR_UNSUPPORTED = 2,      /* valid request this build cannot serve (e.g. tree too large) */
    TRTSPEC_ERR_CUDA = 3              /* the kernel launch failed */
} trtspec_status;

/* Output layouts of rmsnorm_heads (see plugins/README.md, "RmsNormHeads layouts"). */
typedef enum trtspec_rmsnorm_layout {
    TRTSPEC_LAYOUT_HEAD_MAJOR = 0, /* out[k][t][h]: head k's ResBlock input is one contiguous [T, H] matrix */
    TRTSPEC_LAYOUT_TOKEN_MAJOR = 1 /* out[t][k][h]: [T, K*H], all heads of one token side by side */
} trtspec_rmsnorm_layout;

typedef enum trtspec_verify_mode {
    TRTSPEC_VERIFY_GREEDY_IDS = 0,    /* target: int32 argmax ids [B, N1] */
    TRTSPEC_VERIFY_GREEDY_LOGITS = 1, /* target: logits [B, N1, V]; argmax in the kernel (first max wins) */
    TRTSPEC_VERIFY_SAMPLE_LOGITS = 2, /* target: logits [B, N1, V]; p = softmax(logits / max(temp, 1e-6)) */
    TRTSPEC_VERIFY_SAMPLE_PROBS = 3   /* target: unnormalised probabilities [B, N1, V] (already filtered) */
} trtspec_verify_mode;

TRTSPEC_API int trtspec_kernels_abi_version(void);

/* Static string naming a status code. */
TRTSPEC_API const char* trtspec_status_string(int status);

/* Static string with the last CUDA error a launch in this thread returned ("no error" when none). */
TRTSPEC_API const char* trtspec_last_cuda_error(void);

/*
 * RMSNorm of T hidden states with K heads' weights, reading each hidden state once:
 *   out[k, t, :] = w[k] * cast(x32 * rsqrt(mean(x32^2) + eps))      (x32 = float(x[t]), fp32 accumulation)
 * exactly trtspec.models.llama.rms_norm (the product with w rounded to the I/O dtype).
 *
 * x        [T, H], row t at x + t * x_row_stride (elements)
 * weight   [K, H], head k at weight + k * weight_head_stride (elements); same dtype as x
 * out      element (k, t, h) at out + k * out_head_stride + t * out_token_stride + h
 *          (use trtspec_rmsnorm_heads_layout for the two standard layouts)
 * dtype    a trtspec_dtype, shared by x, weight and out
 * Fast path (128-bit loads/stores) when H and all strides are multiples of 16 bytes / element size and
 * the pointers are 16-byte aligned; any other H takes a correct scalar path.
 */
TRTSPEC_API int trtspec_rmsnorm_heads(const void* x, int64_t x_row_stride, const void* weight,
                                      int64_t weight_head_stride, void* out, int64_t out_head_stride,
                                      int64_t out_token_stride, int32_t num_tokens, int32_t hidden,
                                      int32_t num_heads, float eps, int dtype, void* stream);

/* The same with contiguous x [T, H], weight [K, H] and out in a trtspec_rmsnorm_layout. */
TRTSPEC_API int trtspec_rmsnorm_heads_layout(const void* x, const void* weight, void* out, int32_t num_tokens,
                                             int32_t hidden, int32_t num_heads, float eps, int dtype, int layout,
                                             void* stream);

/*
 * Tree verification per sequence, the semantics of trtspec/runtime/verify.py (greedy walk, or the lossless
 * rejection-sampling walk with the splitmix64 counter uniforms and the inverse-CDF bonus draw).
 *
 * paths        int32 [P, L] root-to-leaf node indices, root first, padded with -1 (TreeBuffers.paths);
 *              L = max depth + 1. Nodes are numbered as trtspec/tree.py does (0 = root).
 * draft_tokens int32 [B, N1] the token of each node (index 0 = the root token), N1 = nodes incl. root
 * target_ids   int32 [B, N1] (GREEDY_IDS only, else NULL): the target's argmax after each node
 * target       [B, N1, V] logits or probabilities in target_dtype (other modes, else NULL)
 * temperature  float [B] (SAMPLE_LOGITS; NULL means 1.0)
 * seed         int64 [seed_len] (sampling modes): seed_len 1 = (seed), 2 = (seed, step). The uniforms are
 *              counter_uniform(key, b, node, slot) of verify.py with key = seed + step * 0x9E3779B97F4A7C15
 *              (mod 2^64: the step-th state of the splitmix64 sequence started at seed), so one seed with a
 *              step counter never repeats draws across steps; step 0 (or seed_len 1) is key = seed.
 *
 * Outputs (all int32):
 * accepted_len [B]     accepted draft tokens (0..L-1)
 * out_tokens   [B, L]  accepted tokens then the bonus token, padded with -1
 * best_path    [B]     first path (row of paths) that contains the last accepted node
 * keep_nodes   [B, L]  node indices whose KV to keep: root, then the accepted nodes; padded with -1
 * Limits: N1 <= TRTSPEC_MAX_TREE_NODES, 1 <= L <= N1, 1 <= P <= N1; any B >= 0; V < 2^31.
 */
TRTSPEC_API int trtspec_tree_verify(int mode, const int32_t* paths, int32_t num_paths, int32_t path_len,
                                    const int32_t* draft_tokens, int32_t batch, int32_t num_nodes,
                                    const int32_t* target_ids, const void* target, int target_dtype, int32_t vocab,
                                    const float* temperature, const int64_t* seed, int32_t seed_len,
                                    int32_t* accepted_len,
                                    int32_t* out_tokens, int32_t* best_path, int32_t* keep_nodes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TRTSPEC_KERNELS_H */
