#!/usr/bin/env bash
# One short session on a lent GPU machine: the triton backend on real hardware.
#
#   OUT=gpu-out TESSERA_SRC=src bash scripts/gpu_check.sh
#
# 1. versions + the card;  2. `tessera check --backend triton` (every op, every case incl. the
# 'large' ones, fwd + grads, CUDA tensors; one process per op, 8 at a time: triton's compiles are
# CPU-bound);  3. `tessera bench --backend $BACKEND --quick --shape-scale 1 --repeats 7 --no-compile` (median times, GB/s and
# %-of-copy-ceiling vs eager PyTorch on the same card).  Logs and bench.json land under $OUT.
# Runs with the machine's own torch/triton (no install): versions are printed first.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=${TESSERA_SRC:-$PWD/src} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TESSERA_SEED=0
CHECK_S=${CHECK_S:-240}; BENCH_S=${BENCH_S:-170}; BACKEND=${BACKEND:-triton}  # (BACKEND=cpu OPS=silu: a dry run here)
# CHECK_S caps one op; CHECK_TOTAL_S caps the whole check step (the ops run in waves of 8, so without
# it the step took waves x CHECK_S: the 2026-12-04 H200 run overran its slot that way)
CHECK_TOTAL_S=${CHECK_TOTAL_S:-$CHECK_S}
T="python3 -c 'import sys; from tessera.cli import main; sys.exit(main())'"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, tessera; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/gpu.txt"
ops=${OPS:-$(python3 -c "import tessera; print(' '.join(sorted(tessera.OPS)))")}
start=$(date +%s); deadline=$(( start + CHECK_TOTAL_S ))
mkdir -p "$OUT/check"
# each op gets min(CHECK_S, time left before the deadline); an op reached after it is listed as skipped
printf '%s\n' $ops | xargs -P 8 -I{} sh -c "left=\$(( $deadline - \$(date +%s) )); [ \$left -gt $CHECK_S ] && left=$CHECK_S; \
  if [ \$left -le 5 ]; then echo '{} rc=skipped (CHECK_TOTAL_S)' >> '$OUT/check/rc.txt'; exit 0; fi; \
  timeout \$left $T check --backend $BACKEND --op {} > '$OUT/check/{}.log' 2>&1; echo \"{} rc=\$?\" >> '$OUT/check/rc.txt'"
echo "check: $(( $(date +%s) - start )) s"
sort "$OUT/check/rc.txt"
# one summary of every op's table line and every failure
cat "$OUT"/check/*.log | grep -E "^[a-z_0-9]+ +$BACKEND|FAIL|Error|error" | head -150 > "$OUT/check_summary.txt"
tar -czf "$OUT/check_logs.tar.gz" -C "$OUT" check && rm -rf "$OUT/check"   # (few files come back)
start=$(date +%s)
[ "$BENCH_S" -gt 0 ] && timeout "$BENCH_S" sh -c "$T bench --backend $BACKEND --quick --shape-scale 1 --repeats 7 --no-compile --no-malloc-tuning --out '$OUT/bench'" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - start )) s"
echo "=== check summary"; cat "$OUT/check_summary.txt"
echo "=== bench tail"; tail -60 "$OUT/bench.log" | cut -c1-230
