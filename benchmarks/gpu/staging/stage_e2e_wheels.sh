#!/bin/bash
# Here (needs PyPI), from the repository root: the whole stack for the end-to-end GPU run (LMDeploy +
# FA3 + Ray Serve/Tune + Optuna) for the offline H200s in FOUR parts of <= 60 MiB (.stage/e1..e4),
# ordered so that what training and LMDeploy need arrives first (call 2 can start the checkpoint
# training and LMDeploy's cold compile while Ray's parts travel).
#   bash benchmarks/gpu/staging/stage_e2e_wheels.sh
# One fastapi/starlette pair for both LMDeploy's api_server and Ray Serve: 0.119.1 / 0.48.0 (the
# project's Serve tests pass with it; LMDeploy 0.18 was verified with it on the H200).
set -euo pipefail
S=.stage
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || echo /.stage/ >> .git/info/exclude
[ -d $S/p1 ] && [ -d $S/p2 ] && [ -d $S/p3 ] && [ -d $S/p4 ] || bash ../shared/device/prepare_wheels.sh $S
rm -rf $S/e1 $S/e2 $S/e3 $S/e4 && mkdir -p $S/e1 $S/e2 $S/e3 $S/e4
# LMDeploy, tilelang, tvm-ffi, xgrammar in e1; openai in e2: a part travels with the working tree and the
# two together must stay under the device tool's 64 MiB (e1 with openai was 62.7 MB: over it once the
# tree passed 4.4 MB).
for f in $S/p1/*.whl; do case $(basename "$f") in openai-[0-9]*) cp "$f" $S/e2/ ;; *) cp "$f" $S/e1/ ;; esac; done
for f in $S/p2/*.whl; do case $(basename "$f") in optuna-*) cp "$f" $S/e3/ ;; *) cp "$f" $S/e2/ ;; esac; done
cp $S/p4/flash_attn_3-*.whl $S/e2/                       # FA3 built on the H200 (MTP needs it)
cp $S/p2/ray.whl.part1 $S/e3/ && cp $S/p3/ray.whl.part2 $S/e4/
for f in $S/p4/*.whl; do
  case $(basename "$f") in flash_attn_3-*|pydantic_core-*|fastapi-*|starlette-*) ;; *) cp "$f" $S/e3/ ;; esac
done
for d in e1 e2 e3 e4; do cp $S/p2/install_part.sh $S/$d/; done
du -sh $S/e1 $S/e2 $S/e3 $S/e4
