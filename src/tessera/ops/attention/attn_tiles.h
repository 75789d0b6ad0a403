/* attn_tiles.h -- declarations of attn_tiles.c and the tiling shared by the attention kernels.
 * (Built and hashed together with the kernels: cpu.py passes every source of this folder.) */
#ifndef TSR_ATTN_TILES_H
#define TSR_ATTN_TILES_H
#include "tessera_cpu.h"

enum { ATT_BM = 64, ATT_BN = 64, ATT_DMAX = 256 };   /* query / key rows per tile, max head_dim */

static inline int64_t att_r16(int64_t x) { return (x + 15) & ~(int64_t)15; }
static inline int64_t att_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t att_max(int64_t a, int64_t b) { return a > b ? a : b; }

void tsr_attn_mm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int64_t sak, const float *B,
                 int64_t ldb, float *C, int64_t ldc, int acc);
void tsr_attn_scores(float *s, int64_t n, float scale, float softcap, float *dcap);
float tsr_attn_exp_sum(float *s, int64_t n, float m);
void tsr_attn_exp_cols(float *s, int64_t n, const float *sub);
void tsr_attn_ds(float *ds, const float *p, int64_t n, float d, const float *dcol, const float *dcap, float scale);
void tsr_attn_load_rows(float *dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t pad_rows,
                        int64_t D, int dtype);
void tsr_attn_load_t(float *dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t D, int dtype);
float tsr_attn_max(const float *s, int64_t lo, int64_t hi);

/* Work items: (sequence, block) pairs of every sequence, numbered through the prefix sums
 * pre[0..B] of ceil(L_b / blk); item p belongs to the b with pre[b] <= p < pre[b+1]. */
static inline int64_t att_find(const int64_t *pre, int64_t B, int64_t p) {
    int64_t lo = 0, hi = B;                      /* pre[lo] <= p < pre[hi] */
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (pre[mid] <= p) lo = mid; else hi = mid;
    }
    while (lo + 1 < B && pre[lo + 1] <= p) lo++;  /* skip empty sequences */
    return lo;
}

static inline int64_t *att_prefix(const int32_t *cu, int64_t B, int64_t blk) {
    int64_t *pre = (int64_t *)malloc((size_t)(B + 1) * sizeof(int64_t));
    if (!pre) return NULL;
    pre[0] = 0;
    for (int64_t b = 0; b < B; b++) pre[b + 1] = pre[b] + ((int64_t)cu[b + 1] - cu[b] + blk - 1) / blk;
    return pre;
}

/* bf16 score products (VDPBF16PS) -- see attn_tiles.c */
int tsr_attn_bf16dp(int dtype);
void tsr_attn_smm(int64_t M, int64_t N, int64_t D, const float *A, int64_t lda, const float *B, int64_t ldb,
                  float *C, int64_t ldc, int bfdp);
void tsr_attn_pack_rows(float *dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t pad_rows,
                        int64_t D, int dtype, int bfdp);
void tsr_attn_pack_t(float *dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t D, int dtype,
                     int bfdp);
float tsr_attn_row_step(float *s, int64_t np, float scale, int64_t clo, int64_t chi, float mold,
                        float *mnew_out);
float tsr_attn_dot_bf16(const uint16_t *a, const uint16_t *b, int64_t D);
#endif
