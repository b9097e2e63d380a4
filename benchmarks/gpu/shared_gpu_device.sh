#!/bin/bash
# Issue #41 item 2 on the lent GPU (benchmarks/gpu/measure_shared_gpu.py): the table's plan (MTP-4 for greedy,
# MTP off for sampled, both engines on one GPU) against the best single config, TurboMind at its default memory
# and MTP-4 alone, in alternating rounds. Detached, so polling calls stay short. Back to back (warm 30 s):
#   carry [".stage/t1"]: NO_TRAIN=1 OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t1     # LMDeploy + TurboMind
#   carry [".stage/t3"]: bash .stage/t3/install_part.sh                                      # z3, FA3, ... before part 2
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/shared_gpu_device.sh start [DEADLINE_S] [MORE FLAGS...]
#   then, at once, until it says done:  OUT=$OUT bash benchmarks/gpu/shared_gpu_device.sh collect
# The job runs from a copy of the repository taken at start (later calls re-send the working tree).
# On a GPU of under 100 GiB TurboMind at its default memory does not fit beside the two PyTorch engines: the
# TurboMind arm is left out there (and said so).
set -u
STEP=${1:?start or collect}
OUT=${OUT:?set OUT}
source benchmarks/gpu/staging/device_env.sh
W=/root/sg
mkdir -p $W/out "$OUT"
case $STEP in
  start)
    install_part2 || exit 1
    python3 -c "import lmdeploy, flash_attn_interface; print('lmdeploy', lmdeploy.__version__)" || exit 1
    nvidia-smi --query-gpu=name,memory.total --format=csv | tee $W/out/gpu.txt
    MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
    ARMS=""; [ "$MEM" -lt 102400 ] && ARMS="--arms plan,mtp4,off" && echo "under 100 GiB: no TurboMind arm"
    python3 benchmarks/gpu/measure_mtp.py --versions > $W/out/versions.json 2>&1
    rm -rf $W/repo && mkdir -p $W/repo && cp -r orchestrator tuning benchmarks pyproject.toml $W/repo/
    rm -f $W/done
    DEADLINE=${2:-1150}; shift 2 2>/dev/null || shift $#
    setsid nohup bash -c "cd $W/repo && export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$W/repo PATH=/root/site/bin:\$PATH;
      source /root/tm/env.sh 2>/dev/null;
      python3 benchmarks/gpu/measure_shared_gpu.py --build $W/ckpt --out $W/out --deadline-s $DEADLINE $ARMS $* > $W/log 2>&1;
      echo exit \$? >> $W/log; touch $W/done" > /dev/null 2>&1 < /dev/null &
    sleep 20; tail -n 5 $W/log; echo "shared-gpu started"
    ;;
  collect)
    wait_done $W/done   # holds the machine up to WAIT_S (device_env.sh); call again at once while it runs
    grep "^\[shared-gpu" $W/log 2>/dev/null | tail -n 8
    tail -n 3 $W/log
    [ -f $W/done ] && echo "SHARED-GPU DONE" || echo "shared-gpu still running"
    cp $W/out/shared_gpu.json $W/out/versions.json $W/out/gpu.txt $W/log "$OUT/" 2>/dev/null
    [ -f $W/out/shared_gpu.md ] && cp $W/out/shared_gpu.md "$OUT/"
    [ -d $W/out/engine-logs ] && tar czf "$OUT/engine-logs.tgz" -C $W/out engine-logs
    ;;
  *) echo "unknown step $STEP"; exit 2 ;;
esac
