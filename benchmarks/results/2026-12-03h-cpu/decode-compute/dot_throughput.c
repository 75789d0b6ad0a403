#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 240000000L
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
int main(void){
  __m512i x=_mm512_set1_epi16(3), y=_mm512_set1_epi16(5);
#define DECL(i) __m512i a##i = _mm512_set1_epi32(i);
  R12(DECL)
  double t=now();
  for(long it=0; it<N/12; it++){
#define DOT(i) __asm__ volatile("vpdpwssd %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(y));
    R12(DOT)
  }
  double dt=now()-t;
#define SUM(i) s += _mm512_reduce_add_epi32(a##i);
  int s=0; R12(SUM)
  printf("vpdpwssd zmm: %.3f ns/instr (%d)\n", dt/N*1e9, s);
  __m256i b8 = _mm256_set1_epi8(3); __m512i w0, w1, w2;
  t=now();
  for(long it=0; it<N/12; it++){
#define DOTW(i) __asm__ volatile("vpdpwssd %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(y));
    R12(DOTW)
    __asm__ volatile("vpmovsxbw %1, %0" : "=v"(w0) : "v"(b8));
    __asm__ volatile("vpmovsxbw %1, %0" : "=v"(w1) : "v"(b8));
    __asm__ volatile("vpmovsxbw %1, %0" : "=v"(w2) : "v"(b8));
  }
  dt=now()-t;
  printf("12 vpdpwssd + 3 vpmovsxbw: %.3f ns/dot\n", dt/N*1e9);
  t=now();
  for(long it=0; it<N/12; it++){
    R12(DOTW)
    __asm__ volatile("vpunpcklwd %1, %2, %0" : "=v"(w0) : "v"(x), "v"(y));
    __asm__ volatile("vpunpckhwd %1, %2, %0" : "=v"(w1) : "v"(x), "v"(y));
    __asm__ volatile("vpmovsxbw %1, %0" : "=v"(w2) : "v"(b8));
    __asm__ volatile("vpmovsxbw %1, %0" : "=v"(w2) : "v"(b8));
    __asm__ volatile("vpunpcklwd %1, %2, %0" : "=v"(w0) : "v"(x), "v"(y));
    __asm__ volatile("vpunpckhwd %1, %2, %0" : "=v"(w1) : "v"(x), "v"(y));
  }
  dt=now()-t;
  printf("12 vpdpwssd + 6 shuffles: %.3f ns/dot\n", dt/N*1e9);
  __m512 g=_mm512_set1_ps(1.0001f);
#define DF(i) __m512 f##i = _mm512_set1_ps(i);
  R12(DF)
  t=now();
  for(long it=0; it<N/12; it++){
#define FMA(i) __asm__ volatile("vfmadd231ps %2, %1, %0" : "+v"(f##i) : "v"(g), "v"(g));
    R12(FMA)
  }
  dt=now()-t;
  printf("vfmadd231ps zmm: %.3f ns/instr\n", dt/N*1e9);
  return (int)_mm512_reduce_add_ps(f0) + (int)_mm512_reduce_add_ps(f3) + _mm512_reduce_add_epi32(w0) + _mm512_reduce_add_epi32(w1)+ _mm512_reduce_add_epi32(w2);
}
