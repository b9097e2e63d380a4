#!/bin/bash
# On the lent H200(s), from the repository root, one step per device call, back to back (the machine
# stays warm 30 s between calls). Wheels: `bash benchmarks/gpu/stage_e2e_wheels.sh` here first.
#   carry [".stage/e1"]: bash benchmarks/gpu/e2e_device.sh e1
#   carry [".stage/e2"]: bash benchmarks/gpu/e2e_device.sh e2   # + starts training and LMDeploy's cold compile
#   carry [".stage/e3"]: bash benchmarks/gpu/e2e_device.sh e3
#   carry [".stage/e4"]: bash benchmarks/gpu/e2e_device.sh e4   # + waits for the trained checkpoint
#   then: source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/e2e.py sweep|serve|two-gpu --out $OUT
set -u
STEP=$1
source benchmarks/gpu/device_env.sh
mkdir -p /root/e2e
bash .stage/$STEP/install_part.sh
case $STEP in
  e2)
    NG=$(nvidia-smi -L | wc -l); TG=$((NG - 1))
    # Both in new sessions: they outlive this call (the machine keeps running them until it goes back).
    CUDA_VISIBLE_DEVICES=$TG setsid nohup python3 -m tuning.checkpoint.train /root/ckpt --minutes "${TRAIN_MINUTES:-2}" \
      > /root/e2e/train.log 2>&1 < /dev/null &
    CUDA_VISIBLE_DEVICES=0 setsid nohup python3 benchmarks/gpu/warm_up.py /root/warm > /root/e2e/warm.log 2>&1 < /dev/null &
    sleep 20; tail -2 /root/e2e/train.log /root/e2e/warm.log
    ;;
  e4)
    python3 -c "import ray, optuna, ray.tune, ray.serve, lmdeploy, flash_attn_interface, fastapi; print('imports ok: ray', ray.__version__, 'optuna', optuna.__version__, 'lmdeploy', lmdeploy.__version__, 'fastapi', fastapi.__version__)"
    for _ in $(seq 1 ${WAIT_STEPS:-100}); do [ -f /root/ckpt/mtp_expected.json ] && break; sleep 5; done
    tail -3 /root/e2e/train.log; tail -4 /root/e2e/warm.log
    ls -la /root/ckpt | head
    ;;
esac
