#!/bin/bash
# Here (needs PyPI), from the repository root: the LMDeploy + FA3 wheel set for the lent H200 in TWO
# parts instead of ../shared/device's four, by leaving out what one-GPU LMDeploy never imports
# (Ray: imported only by LMDeploy's ray executor/engine; Optuna; Ray Serve's dependencies).
#   bash benchmarks/gpu/staging/stage_wheels.sh        # writes .stage/q1 (60 MiB) and .stage/q2 (36 MiB)
# Device calls, back to back (the machine stays warm 30 s between calls):
#   carry [".stage/q1"]: bash .stage/q1/install_part.sh
#   carry [".stage/q2"]: bash .stage/q2/install_part.sh && <work>   (source benchmarks/gpu/staging/device_env.sh first)
# Verified on the H200 on 2026-11-29: LMDeploy 0.18.0 serves qwen3_5_mtp with FA3 from these parts.
set -euo pipefail
S=.stage
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || echo /.stage/ >> .git/info/exclude
[ -d $S/p1 ] && [ -d $S/p2 ] && [ -d $S/p4 ] || bash ../shared/device/prepare_wheels.sh $S
rm -rf $S/q1 $S/q2 && mkdir -p $S/q1 $S/q2
cp $S/p1/* $S/q1/
for f in $S/p2/*.whl; do case $(basename "$f") in optuna-*) ;; *) cp "$f" $S/q2/ ;; esac; done
cp $S/p4/flash_attn_3-*.whl $S/q2/
cp $S/p2/install_part.sh $S/q2/
du -sh $S/q1 $S/q2
