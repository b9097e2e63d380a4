#!/bin/bash
# The MoE testbed's landscape (issue #22 item 3, benchmarks/gpu/measure_landscape.py) on the lent H200:
# detached, so polling calls stay short; it fills over several leases (what a lease measured comes back
# in landscape.json, and SEED= carries it into the next one).
#   carry [".stage/t1"]: NO_TRAIN=1 OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t1     # LMDeploy
#   carry [".stage/t3"]: bash .stage/t3/install_part.sh                                      # z3, FA3, ... before part 2
#   carry [".stage/t2"]: [SEED=benchmarks/results/<dir>/landscape.json] OUT=$OUT bash benchmarks/gpu/staging/testbed_device.sh start [DEADLINE_S]
#   then, until it says done:  OUT=$OUT bash benchmarks/gpu/staging/testbed_device.sh collect
# DEADLINE_S (default 1200): no engine starts after it; an engine of the MoE takes ~75-190 s to start.
# LANDSCAPE_ARGS: more measure_landscape.py flags (e.g. "--agreements 0.7,0.9,0.5": the order engines run in;
# keep the same set in every lease, or the later lease plans other cells).
set -u
STEP=${1:?start or collect}
OUT=${OUT:?set OUT}
source benchmarks/gpu/staging/device_env.sh
W=/root/landscape
mkdir -p $W/out "$OUT"
case $STEP in
  start)
    install_part2 || exit 1
    python3 -c "import lmdeploy, flash_attn_interface; print('lmdeploy', lmdeploy.__version__)" || exit 1
    [ -n "${SEED:-}" ] && cp "$SEED" $W/out/landscape.json && echo "seeded from $SEED"
    python3 benchmarks/gpu/measure_mtp.py --versions > $W/out/versions.json 2>&1
    rm -f $W/done
    setsid nohup bash -c "source benchmarks/gpu/staging/device_env.sh;
      python3 benchmarks/gpu/measure_landscape.py --out $W/out --work $W/ckpt --deadline-s ${2:-1200} ${LANDSCAPE_ARGS:-} > $W/log 2>&1;
      touch $W/done" > /dev/null 2>&1 < /dev/null &
    sleep 5; echo "landscape started"
    ;;
  collect)
    wait_done $W/done   # holds the machine up to WAIT_S (device_env.sh); call again at once while it runs
    grep "^\[landscape" $W/log 2>/dev/null | tail -n 6
    [ -f $W/done ] && echo "LANDSCAPE DONE" || echo "landscape still running"
    cp $W/out/landscape.json $W/out/versions.json $W/log "$OUT/" 2>/dev/null
    [ -f $W/done ] && [ -d $W/out/engine-logs ] && tar czf "$OUT/engine-logs.tgz" -C $W/out engine-logs
    ;;
  *) echo "unknown step $STEP"; exit 2 ;;
esac
