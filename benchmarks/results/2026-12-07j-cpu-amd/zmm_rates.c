#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
#define N 100000000LL
#define BODY(NAME, EXPR) { \
  __m512 a0=_mm512_set1_ps(1.1f),a1=_mm512_set1_ps(1.2f),a2=_mm512_set1_ps(1.3f),a3=_mm512_set1_ps(1.4f),a4=_mm512_set1_ps(1.5f),a5=_mm512_set1_ps(1.6f),a6=_mm512_set1_ps(1.7f),a7=_mm512_set1_ps(1.8f); \
  __m512 b=_mm512_set1_ps(0.999f); uint64_t t0=__rdtsc(); \
  for (long long i=0;i<N/8;i++){ a0=EXPR(a0);a1=EXPR(a1);a2=EXPR(a2);a3=EXPR(a3);a4=EXPR(a4);a5=EXPR(a5);a6=EXPR(a6);a7=EXPR(a7);} \
  uint64_t t1=__rdtsc(); __m512 s=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)),_mm512_add_ps(_mm512_add_ps(a4,a5),_mm512_add_ps(a6,a7))); \
  float o[16]; _mm512_storeu_ps(o,s); printf("%-14s %.3f tsc/op (%g)\n", NAME, (double)(t1-t0)/N, o[0]); }
#define F_REDUCE(x) _mm512_reduce_ps(x, 8)
#define F_RANGE(x) _mm512_range_ps(x, b, 0x0B)
#define F_CVT(x) _mm512_castsi512_ps(_mm512_cvtps_epi32(x))
#define F_CVTI(x) _mm512_cvtepi32_ps(_mm512_castps_si512(x))
#define F_FMA(x) _mm512_fmadd_ps(x, b, b)
#define F_TERN(x) _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(x), _mm512_castps_si512(b), _mm512_castps_si512(b), 0xEA))
#define F_PERMB(x) _mm512_castsi512_ps(_mm512_permutex2var_epi8(_mm512_castps_si512(x), _mm512_castps_si512(b), _mm512_castps_si512(x)))
#define F_PERMD(x) _mm512_castsi512_ps(_mm512_permutexvar_epi32(_mm512_castps_si512(b), _mm512_castps_si512(x)))
#define F_DPB(x) _mm512_castsi512_ps(_mm512_dpbusd_epi32(_mm512_castps_si512(x), _mm512_castps_si512(b), _mm512_castps_si512(b)))
#define F_PACK(x) _mm512_castsi512_ps(_mm512_packs_epi32(_mm512_castps_si512(x), _mm512_castps_si512(b)))
#define F_ADD(x) _mm512_add_ps(x, b)
#define F_MINB(x) _mm512_castsi512_ps(_mm512_min_epi8(_mm512_castps_si512(x), _mm512_castps_si512(b)))
int main(){
  BODY("vreduceps", F_REDUCE) BODY("vrangeps", F_RANGE) BODY("vcvtps2dq", F_CVT) BODY("vcvtdq2ps", F_CVTI)
  BODY("vfmadd", F_FMA) BODY("vpternlogd", F_TERN) BODY("vpermt2b", F_PERMB) BODY("vpermd", F_PERMD)
  BODY("vpdpbusd", F_DPB) BODY("vpackssdw", F_PACK) BODY("vaddps", F_ADD) BODY("vpminsb", F_MINB)
  return 0; }
