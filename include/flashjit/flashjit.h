/* flashjit C ABI: run-time generated FlashAttention kernels.
 *
 * Every call returns a flashjit_status; on failure a message for the calling thread is available
 * from flashjit_last_error(). No C++ exception crosses this boundary. Structs start with a
 * `struct_size` field so later versions can append fields; initialise them with the *_init calls.
 *
 * Conventions (FlashAttention's):
 *   Q [tokens, heads_q, head_dim_qk], K [tokens, heads_kv, head_dim_qk], V [tokens, heads_kv, head_dim_v],
 *   O [tokens, heads_q, head_dim_v] in the dtype of Q. Strides are in elements; the last dim is contiguous;
 *   batch, token and head may nest in any order (e.g. PyTorch's [batch, heads, tokens, dim]) as long as
 *   no two rows overlap.
 *   Batch mode: sequence b starts at ptr + b * batch_stride. Varlen: cu_seqlens_q/k (device, int32,
 *   batch + 1 prefix sums) address rows of a packed tensor and batch_stride is ignored.
 *   Causal with seqlen_q != seqlen_k is aligned bottom-right: query i sees key j <= i + seqlen_k - seqlen_q.
 *   LSE is float32 in natural log: [batch, heads_q, seqlen_q] (batch mode) or [heads_q, total_q] (varlen).
 *   A query row that sees no key gets O = 0 and LSE = -inf.
 */
#ifndef FLASHJIT_H
#define FLASHJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHJIT_VERSION_MAJOR 0
#define FLASHJIT_VERSION_MINOR 1
#define FLASHJIT_VERSION_PATCH 0

/* In C++ the enums below have a fixed underlying type (int32_t, the size C gives them): a caller's
 * out-of-range value, which is refused with FLASHJIT_INVALID_ARGUMENT, is then a value of the type
 * rather than undefined behaviour. */
#ifdef __cplusplus
#define FLASHJIT_ENUM_BASE : int32_t
#else
#define FLASHJIT_ENUM_BASE
#endif

typedef enum flashjit_status FLASHJIT_ENUM_BASE {
  FLASHJIT_OK = 0,
  FLASHJIT_INVALID_ARGUMENT = 1,   /* a parameter is wrong; the message names it */
  FLASHJIT_UNSUPPORTED = 2,        /* valid but not supported (e.g. no kernel for this arch) */
  FLASHJIT_COMPILE_ERROR = 3,      /* NVRTC / ptxas / nvJitLink failed; the message carries the log */
  FLASHJIT_DRIVER_ERROR = 4,       /* a CUDA driver call failed, or no driver is present */
  FLASHJIT_NOT_IN_BUNDLE = 5,      /* JIT is off and no registered bundle or cache has the kernel */
  FLASHJIT_OUT_OF_RESOURCES = 6,   /* the kernel needs more shared memory than the device has */
  FLASHJIT_FALLBACK_FORBIDDEN = 7, /* strict mode: the preferred kernel cannot run */
  FLASHJIT_INTERNAL = 8
} flashjit_status;

typedef enum flashjit_dtype FLASHJIT_ENUM_BASE { FLASHJIT_FP16 = 0, FLASHJIT_BF16 = 1 } flashjit_dtype;

/* Kernel family; AUTO lets the planner choose (fa3 on sm_90a, fa2 elsewhere, decode_splitk for decode). */
typedef enum flashjit_variant FLASHJIT_ENUM_BASE {
  FLASHJIT_VARIANT_AUTO = 0,
  FLASHJIT_VARIANT_FA2 = 1,
  FLASHJIT_VARIANT_FA3 = 2,
  FLASHJIT_VARIANT_DECODE_SPLITK = 3
} flashjit_variant;

typedef enum flashjit_backend FLASHJIT_ENUM_BASE {
  FLASHJIT_BACKEND_AUTO = 0,
  FLASHJIT_BACKEND_NVRTC = 1,
  FLASHJIT_BACKEND_MLIR = 2
} flashjit_backend;

/* Element strides of one operand; all zero means contiguous [batch, tokens, heads, dim]. Any order
 * of the three is accepted where rows do not overlap: head-major [batch, heads, tokens, dim] is
 * {heads * tokens * dim, dim, tokens * dim}. */
typedef struct flashjit_strides {
  int64_t batch;
  int64_t token;
  int64_t head;
} flashjit_strides;

typedef struct flashjit_problem {
  uint32_t struct_size; /* sizeof(flashjit_problem) */
  flashjit_dtype dtype;
  int32_t batch;
  int32_t seqlen_q; /* batch mode: every sequence; varlen: the maximum */
  int32_t seqlen_k;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t head_dim_qk; /* multiple of 8, 8..256 */
  int32_t head_dim_v;  /* 0 means head_dim_qk */
  const void *q;
  const void *k;
  const void *v;
  void *o;
  float *lse; /* optional */
  flashjit_strides q_strides, k_strides, v_strides, o_strides;
  /* Varlen (both null, or both set). total_q/total_k are the packed row counts. */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_k;
  int32_t total_q;
  int32_t total_k;
  /* Optional host copies of cu_seqlens_q/k: when given, they are validated (monotone, within total). */
  const int32_t *cu_seqlens_q_host;
  const int32_t *cu_seqlens_k_host;
  int32_t causal;       /* bottom-right aligned */
  int32_t window_left;  /* -1: unbounded */
  int32_t window_right; /* -1: unbounded */
  float softcap;        /* 0: off */
  float scale;          /* 0: 1/sqrt(head_dim_qk) */
  /* Paged KV (block_table non-null): K/V are pages [num_pages, page_size, heads_kv, dim];
   * k_strides.batch / v_strides.batch are then the strides between pages. */
  const int32_t *block_table;      /* device [batch, max_pages_per_seq] */
  const int32_t *seqlens_k;        /* device [batch] KV lengths (paged) */
  const int32_t *seqlens_k_host;   /* optional host copy [batch], validated against the table when given */
  const int32_t *block_table_host; /* optional host copy [batch, max_pages_per_seq]: page indices validated */
  int32_t page_size;
  int32_t max_pages_per_seq;
  int32_t num_pages;
  /* Scratch for split-K decode partials, or for the fa3 prefill's tail split or tile counter
   * (device memory, 256-byte aligned); see flashjit_workspace_size, which reports 0 where the
   * problem's kernel needs none, and flashjit_plan. May be null: decode then runs the prefill kernel,
   * and the fa3 prefill walks its last waves in whole tiles or its causal tiles in a fixed order
   * (all logged). */
  void *workspace;
  size_t workspace_bytes;
  uint64_t flags; /* reserved, 0 */
} flashjit_problem;

typedef struct flashjit_options {
  uint32_t struct_size;
  flashjit_backend backend;
  int32_t disk_cache;       /* 1: use the disk cache (default; FLASHJIT_CACHE=off turns it off) */
  int32_t jit;              /* 1: compile on a miss (default; FLASHJIT_JIT=off turns it off) */
  int32_t strict;           /* 1: a fallback from the preferred kernel is an error */
  const char *cache_dir;    /* NULL: FLASHJIT_CACHE_DIR, $XDG_CACHE_HOME/flashjit, ~/.cache/flashjit */
  flashjit_variant variant; /* AUTO (default); forcing one that cannot run the problem is an error */
} flashjit_options;

typedef struct flashjit_runtime_s *flashjit_runtime;
typedef struct CUstream_st *flashjit_stream; /* a CUstream / cudaStream_t; NULL = default stream */

void flashjit_problem_init(flashjit_problem *problem);
void flashjit_options_init(flashjit_options *options);

/* Thread-local message of the last failed call on this thread ("" if none). */
const char *flashjit_last_error(void);
const char *flashjit_status_name(flashjit_status status);
const char *flashjit_version(void);

flashjit_status flashjit_runtime_create(const flashjit_options *options, flashjit_runtime *out);
void flashjit_runtime_destroy(flashjit_runtime runtime);

/* Compile (or fetch) and load the kernel for this problem without launching it. */
flashjit_status flashjit_prepare(flashjit_runtime runtime, const flashjit_problem *problem);
/* Launch on `stream` in the current context. Allocates nothing, never synchronizes. */
flashjit_status flashjit_forward(flashjit_runtime runtime, const flashjit_problem *problem, flashjit_stream stream);
/* Human-readable: the kernel chosen for `problem`, its plan, and why. Writes at most `capacity`
 * bytes (NUL-terminated) and stores the full length in *length if non-null. */
flashjit_status flashjit_explain(flashjit_runtime runtime, const flashjit_problem *problem, char *buffer,
                                 size_t capacity, size_t *length);

/* Workspace: plan once, run many
 *
 * Prefill on sm_90a (fa3, no causal mask, window or varlen, head dims up to 128 by default): the
 * last waves of tiles are cut evenly by keys across the SMs, and a tile cut in two is merged by the
 * second CTA to finish it, through scratch in problem->workspace (flashjit_workspace_size bytes).
 * Its arrival counters must start at zero; each launch leaves them at zero. forward zeroes them the
 * first time it sees a workspace pointer; call flashjit_plan (which zeroes them again and
 * synchronizes) after allocating new memory at an old address or writing the workspace yourself.
 * Causal prefill on sm_90a (fa3, contiguous K/V, most head dims): each CTA draws its next tile from a
 * counter at the workspace's start (4 bytes), zeroed and left at zero in the same way.
 * A decode plan and a prefill's counters write over each other: plan the decode again after a
 * prefill used its workspace (forward says so otherwise).
 *
 * A problem with 1..16 query tokens per sequence (batch mode) runs the split-K decode kernel, which
 * needs device scratch (problem->workspace) holding a schedule made on the host from the KV lengths:
 *   flashjit_workspace_size -> allocate -> flashjit_plan (per decode step, when lengths change)
 *   -> flashjit_forward for every layer (fixed grid: capture it in a CUDA graph and replay it).
 * flashjit_plan reads the lengths from seqlens_k_host (paged) or takes seqlen_k for every sequence,
 * copies the schedule into the workspace and synchronizes; forward then reads nothing on the host.
 * Without a workspace, a decode problem runs the prefill kernel instead (logged; an error in strict
 * mode). */
flashjit_status flashjit_workspace_size(flashjit_runtime runtime, const flashjit_problem *problem, size_t *bytes);
flashjit_status flashjit_plan(flashjit_runtime runtime, const flashjit_problem *problem);

/* Merge of partial attention states (O_i, LSE_i) into one (O, LSE), as the split-K decode does
 * internally: LSE = log(sum_i exp(LSE_i)), O = sum_i exp(LSE_i - LSE) * O_i. Engines use it for
 * ring / context-parallel attention: each GPU attends to its shard of the keys with `lse` set, the
 * partial O (as float32) and LSE are exchanged (e.g. with NCCL), and one merge gives the exact
 * result. A state with LSE = -inf weighs nothing; a row whose states are all -inf gets O = 0,
 * LSE = -inf. See docs/merge-states.md. */
typedef struct flashjit_merge_problem {
  uint32_t struct_size; /* sizeof(flashjit_merge_problem) */
  flashjit_dtype dtype; /* of o */
  int32_t num_states;
  int32_t rows;             /* e.g. tokens x heads */
  int32_t head_dim_v;       /* multiple of 8, up to 256 */
  const float *partial_o;   /* [num_states][rows][head_dim_v], rows contiguous */
  const float *partial_lse; /* [num_states][rows], natural log */
  int64_t state_stride_o;   /* elements between states in partial_o (0: rows * head_dim_v) */
  int64_t state_stride_lse; /* elements between states in partial_lse (0: rows) */
  void *o;                  /* [rows] x head_dim_v in dtype */
  int64_t o_row_stride;     /* elements between rows of o (0: head_dim_v) */
  float *lse;               /* optional [rows] */
} flashjit_merge_problem;

void flashjit_merge_problem_init(flashjit_merge_problem *problem);
flashjit_status flashjit_merge_states(flashjit_runtime runtime, const flashjit_merge_problem *problem,
                                      flashjit_stream stream);

/* Bundles
 *
 * A bundle holds pre-generated kernels (`flashjit aot --out DIR` or `--bundle FILE.fjb`). Lookup
 * order: memory -> registered bundles (in registration order; the first holding a kernel wins) ->
 * disk cache -> JIT. FLASHJIT_BUNDLE_PATH (colon-separated) registers bundles when a runtime is
 * created. With JIT off (options.jit = 0 or FLASHJIT_JIT=off) a kernel found nowhere is
 * FLASHJIT_NOT_IN_BUNDLE, naming it and the closest kernels the bundles hold. A bundle hit needs
 * no compiler: NVRTC is not loaded. */

/* Opens, verifies (format version, kernel sources, every cubin's xxh64) and registers a bundle
 * directory or .fjb file. A bundle that fails a check is refused (FLASHJIT_INVALID_ARGUMENT) with
 * a message naming the kernel and the reason. */
flashjit_status flashjit_register_bundle(flashjit_runtime runtime, const char *path);

/* Whether `problem` is served without JIT on `arch` ("sm80", "sm86", "sm89", "sm90a"; NULL or ""
 * means the current device, which needs a current CUDA context): *served = 1 when memory, a
 * registered bundle or the disk cache holds its kernel. Nothing is compiled or loaded. The data
 * pointers (q, k, v, o) may be null: they are then assumed 16-byte aligned. */
flashjit_status flashjit_is_served(flashjit_runtime runtime, const flashjit_problem *problem, const char *arch,
                                   int *served);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHJIT_H */
