#!/bin/bash
# Here (needs PyPI and gcc), from the repository root: LMDeploy 0.18 WITH TurboMind for the offline
# CUDA 13 H200, in THREE carry parts (.stage/t1, .stage/t2, .stage/t3), instead of stage_wheels.sh's
# q1/q2 (which strip TurboMind's 347 MB binary) plus a third part for the binary:
#   - LMDeploy's, TileLang's and z3's wheels are recompressed with LZMA (lzma_wheel.py; pip installs
#     them as they are; LMDeploy's build-only libxgrammar.a is left out): LMDeploy with its binary
#     drops from 102 MiB to 34;
#   - t1/turbomind-lib: libcudart.so.12 (from nvidia-cuda-runtime-cu12 12.9.79) and the cuBLAS 12
#     pass-through + empty cuBLASLt 12 (turbomind/build_shim.sh): what the binary misses on CUDA 13
#     (docs/turbomind.md).
# t1 holds LMDeploy, the libraries and what training needs (fla), so call 1 can check that TurboMind
# loads and start training while t3 (z3 and what call 1 does not import, 31 MiB) and t2 (TileLang, 37 MiB) travel, in that order.
# Two more parts carry Ray (Serve, Tune) and Optuna for sweeping and serving on the device: .stage/r0
# (~33 MiB) Ray's wheel alone, .stage/r1 (~25 MiB) the rest (together they no longer fit one call beside
# the repository's files): Ray's wheel LZMA-recompressed without its Java jar (ray_dist.jar, 31 MiB compressed, used
# only by Ray's Java API) and the dashboard's source map, Ray's runtime needs and Optuna's database stack
# from .stage/dl4, Optuna from .stage/dl (not py-spy: nothing here profiles).
#   bash benchmarks/gpu/staging/stage_turbomind.sh           # LZMA takes minutes of one core (cached in .stage/lz)
# Device calls: benchmarks/gpu/staging/turbomind_device.sh (t1, t2, measure).
set -euo pipefail
S=.stage
HERE=$(cd "$(dirname "$0")" && pwd)
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || echo /.stage/ >> .git/info/exclude
[ -d $S/dl ] && [ -d $S/q1 ] && [ -d $S/q2 ] || bash "$HERE/stage_wheels.sh"
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for n in 17 27 28; do P="$P --platform manylinux_2_${n}_x86_64"; done
python3 -m pip download -q $P --platform manylinux2014_x86_64 -d $S/dltm nvidia-cuda-runtime-cu12==12.9.79 2>&1 \
  | grep -v "^WARNING" || true

mkdir -p $S/lz
for w in $S/dl/lmdeploy-0.18.0-*.whl $S/dl/tilelang-*.whl $S/dl/z3_solver-*.whl $S/dl/ray-2.60.0-*.whl; do
  [ -f "$S/lz/$(basename "$w")" ] || nice python3 "$HERE/lzma_wheel.py" "$w" $S/lz \
    --drop lmdeploy/turbomind/lib64/libxgrammar.a --drop ray/jars/ray_dist.jar \
    --drop ray/dashboard/client/build/static/js/main.84605326.js.map
done

# A device call carries the repository's files too (~8 MiB and growing) under one 64 MiB limit: TileLang (t2) and
# z3 (t3), 37 and 21 MiB, no longer fit one call together.
rm -rf $S/t1 $S/t2 $S/t3 $S/r0 $S/r1 && mkdir -p $S/t1/turbomind-lib $S/t2 $S/t3 $S/r0 $S/r1
unzip -q -j -o $S/dltm/nvidia_cuda_runtime_cu12-12.9.79-*.whl 'nvidia/cuda_runtime/lib/libcudart.so.12' -d $S/t1/turbomind-lib
bash "$HERE/turbomind/build_shim.sh" $S/t1/turbomind-lib
cp $S/lz/lmdeploy-0.18.0-*.whl $S/t1/
cp $S/lz/tilelang-*.whl $S/t2/
cp $S/lz/z3_solver-*.whl $S/t3/
# What call 1 itself does not import (TileLang's FFI, the OpenAI server's packages, FA3, xgrammar) travels with z3 in t3, which every
# step that starts an engine installs first: t1 then leaves the repository room to grow under the limit.
for f in $S/q1/*.whl $S/q2/*.whl; do
  case $(basename "$f") in
    lmdeploy-*|tilelang-*|z3_solver-*) ;;
    apache_tvm_ffi-*|openai-*|openai_harmony-*|flash_attn_3-*|xgrammar-*) cp "$f" $S/t3/ ;;
    *) cp "$f" $S/t1/ ;;
  esac
done
cp $S/lz/ray-2.60.0-*.whl $S/r0/
cp $S/dl/optuna-*.whl $S/r1/
for f in $S/dl4/*.whl; do
  case $(basename "$f") in
    py_spy-*) ;;
    *) cp "$f" $S/r1/ ;;
  esac
done
for d in t1 t2 t3 r0 r1; do cp $S/q1/install_part.sh $S/$d/; done
# Each part travels beside the repository's files (tracked, and untracked ones not ignored) under 64 MiB a call;
# a lease's results are committed between calls, so warn while less than 8 MiB is left.
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1 || true)
for d in t1 t2 t3 r0 r1; do
  BYTES=$(( $(du -sb $S/$d | cut -f1) + TREE ))
  printf '%s: %d MiB with the repository (%d MiB left)\n' $d $((BYTES >> 20)) $(( (67108864 - BYTES) >> 20 ))
  [ $((67108864 - BYTES)) -ge $((8 << 20)) ] || echo "WARNING: $d leaves under 8 MiB for the repository to grow"
done
