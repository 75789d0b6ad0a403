#!/bin/sh
# build.sh NAME SRCDIR
gcc $EXTRA -O3 -std=c11 -shared -fPIC -fopenmp -fno-math-errno -ffp-contract=fast -fno-trapping-math -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mprefer-vector-width=512 -I "$(dirname "$0")/../../../../src/tessera/csrc" -I $2 $2/decode_attention.c -o "$(dirname "$0")/$1.so" -lm
