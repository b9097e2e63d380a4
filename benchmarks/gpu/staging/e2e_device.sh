#!/bin/bash
# On the lent H200(s), from the repository root, one step per device call, back to back (the machine
# stays warm 30 s between calls). Wheels: `bash benchmarks/gpu/staging/stage_e2e_wheels.sh` here first.
#   carry [".stage/e1"]: bash benchmarks/gpu/staging/e2e_device.sh e1
#   carry [".stage/e2"]: bash benchmarks/gpu/staging/e2e_device.sh e2   # + starts training and LMDeploy's cold compile
#   carry [".stage/e3"]: bash benchmarks/gpu/staging/e2e_device.sh e3
#   carry [".stage/e4"]: bash benchmarks/gpu/staging/e2e_device.sh e4   # + waits for the trained weights
#   then: source benchmarks/gpu/staging/device_env.sh && taskset -c $(cat /root/e2e/gpu_cpus) python3 benchmarks/gpu/e2e.py sweep|serve|two-gpu --out $OUT
#   (pinned: run 2 ran pinned to 16 physical cores, run 3 unpinned on 32 and measured 20-50 % lower)
#
# Router overhead (issue #4) on the same machine, at the same time, on its own physical cores:
#   after e4 (Ray Serve is installed): bash benchmarks/gpu/staging/e2e_device.sh router16   # starts it in the background
#   every later GPU command runs under `taskset -c $(cat /root/e2e/gpu_cpus)` (the other half of the cores)
#   last: bash benchmarks/gpu/staging/e2e_device.sh router16-collect                          # copies its results to $OUT
set -u
STEP=$1
source benchmarks/gpu/staging/device_env.sh
mkdir -p /root/e2e
if ! [ -f /root/e2e/gpu_cpus ]; then
  # Split the machine by physical core (hyper-thread siblings stay together): first half for the GPU
  # work, second half for the CPU-only router benchmark.
  python3 - <<'PY'
import glob, os
cores = {}
for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
    cpu = int(d.split("/")[-2][3:])
    key = (int(open(d + "/physical_package_id").read()), int(open(d + "/core_id").read()))
    cores.setdefault(key, []).append(cpu)
keys = sorted(cores)
half = len(keys) // 2
gpu = sorted(c for k in keys[:half] for c in cores[k]); bench = sorted(c for k in keys[half:] for c in cores[k])
open("/root/e2e/gpu_cpus", "w").write(",".join(map(str, gpu)))
open("/root/e2e/bench_cpus", "w").write(",".join(map(str, bench)))
print(f"{len(keys)} physical cores, {os.cpu_count()} CPUs; GPU work on {len(gpu)} CPUs, router benchmark on {len(bench)}")
PY
fi
GPU_CPUS=$(cat /root/e2e/gpu_cpus); BENCH_CPUS=$(cat /root/e2e/bench_cpus)
case $STEP in
  router16)
    NB=$(echo "$BENCH_CPUS" | tr ',' '\n' | wc -l)
    # Three modes one after another (never concurrently): direct ingress, Serve's proxy, direct ingress + throughput-optimized.
    taskset -c "$BENCH_CPUS" setsid nohup bash -c "
      for MODE in direct-ingress proxy direct-ingress-tput; do
        case \$MODE in direct-ingress) F=--direct-ingress;; proxy) F=;; direct-ingress-tput) F='--direct-ingress --throughput-optimized';; esac
        python3 benchmarks/router_overhead.py \$F --num-cpus $NB --out-dir /root/e2e/router16/\$MODE > /root/e2e/router16-\$MODE.log 2>&1
      done; touch /root/e2e/router16/done" > /dev/null 2>&1 < /dev/null &
    mkdir -p /root/e2e/router16; sleep 5; echo "router benchmark started on CPUs $BENCH_CPUS ($NB)"
    exit 0
    ;;
  router16-collect)
    ls -la /root/e2e/router16 /root/e2e/router16/* 2>&1 | head -30
    tar czf "$OUT/router16.tgz" -C /root/e2e router16 $(cd /root/e2e && ls router16-*.log)
    exit 0
    ;;
esac
bash .stage/$STEP/install_part.sh
case $STEP in
  e2)
    NG=$(nvidia-smi -L | wc -l); TG=$((NG - 1))
    # Both in new sessions: they outlive this call (the machine keeps running them until it goes back).
    CUDA_VISIBLE_DEVICES=$TG taskset -c "$GPU_CPUS" setsid nohup python3 -m tuning.checkpoint.train /root/ckpt --minutes "${TRAIN_MINUTES:-2}" \
      > /root/e2e/train.log 2>&1 < /dev/null &
    CUDA_VISIBLE_DEVICES=0 taskset -c "$GPU_CPUS" setsid nohup python3 benchmarks/gpu/staging/warm_up.py /root/warm > /root/e2e/warm.log 2>&1 < /dev/null &
    sleep 20; tail -n 2 /root/e2e/train.log /root/e2e/warm.log
    ;;
  e4)
    python3 -c "import ray, optuna, ray.tune, ray.serve, lmdeploy, flash_attn_interface, fastapi; print('imports ok: ray', ray.__version__, 'optuna', optuna.__version__, 'lmdeploy', lmdeploy.__version__, 'fastapi', fastapi.__version__)"
    # The trained weights are saved (atomically) before the accept-length prediction runs (~1 min more,
    # on the last GPU): the sweep needs only the weights.
    for _ in $(seq 1 ${WAIT_STEPS:-100}); do grep -q "saved /root/ckpt/model.safetensors" /root/e2e/train.log && break; sleep 5; done
    tail -3 /root/e2e/train.log; tail -4 /root/e2e/warm.log
    ls -la /root/ckpt | head
    ;;
esac
