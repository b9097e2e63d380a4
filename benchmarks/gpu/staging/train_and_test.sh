#!/bin/bash
# On the lent H200, after the wheels are installed (benchmarks/gpu/staging/stage_wheels.sh says how):
#   OUT=/some/dir bash benchmarks/gpu/staging/train_and_test.sh [MINUTES]
# Foreground: build + train the checkpoint into $CKPT (default /root/ckpt) and predict its MTP
# acceptance. Background, at the same time: the GPU tests on an oracle checkpoint of the same shape.
# They pay LMDeploy's cold start (TileLang/Triton compilation, ~3 min on a fresh machine) while
# the GPU trains, so the measurement call that follows starts its engines from warm caches.
set -u
MIN=${1:-3}
CKPT=${CKPT:-/root/ckpt}
OUT=${OUT:?set OUT}
source benchmarks/gpu/staging/device_env.sh
mkdir -p "$OUT"
python3 benchmarks/gpu/measure_mtp.py --versions > "$OUT/versions.json" 2>&1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
( timeout 560 python3 -m pytest tests/gpu/test_gpu_lmdeploy.py -v -s -p no:cacheprovider -o cache_dir=/tmp/pc \
    > "$OUT/gpu_tests.log" 2>&1; echo "pytest exit $?" >> "$OUT/gpu_tests.log" ) &
TESTS=$!
timeout 500 python3 -m tuning.checkpoint.train "$CKPT" --minutes "$MIN" > "$OUT/train.log" 2>&1
echo "train exit $?" >> "$OUT/train.log"
cp "$CKPT/train_report.json" "$CKPT/mtp_expected.json" "$OUT/" 2>/dev/null
wait $TESTS
grep -E "expected accept|tokens_per_s|exit|Error|error" "$OUT/train.log" | tail -8
grep -E "PASSED|FAILED|ERROR|SKIPPED|ready in|passed|failed|exit" "$OUT/gpu_tests.log" | tail -15
