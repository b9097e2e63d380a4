#!/bin/bash
# On the lent H200 (CUDA 13), from the repository root, one step per device call, back to back (the
# machine stays warm 30 s between calls). Parts: `bash benchmarks/gpu/staging/stage_turbomind.sh` here first.
# Every step that carries .stage/t2 needs .stage/t3 (z3, FA3 and what else call 1 does not import) installed in the call before:
#   carry [".stage/t3"]: bash .stage/t3/install_part.sh
#   carry [".stage/t1"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t1
#       installs part 1 (LMDeploy 0.18 WITH TurboMind's binary, the CUDA 12 runtime, the cuBLAS shim,
#       fla), puts the libraries where the binary looks first, checks that it loads (the project's
#       preflight), and starts training the test checkpoint /root/ckpt in the background (~4 min; TRAIN_STEPS
#       optimiser steps, 480 by default: the same recipe for as long in every lease; the weights still differ
#       between leases). CKPT_BUILD="--agreement 0.965 --sharpness 7.6" builds it instead (tuning.checkpoint.build
#       flags; the test shape, the same bytes in every lease): for leases that share a sweep's tables
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t2
#       installs part 2, runs tests/gpu/test_gpu_turbomind.py on an oracle checkpoint (pays LMDeploy's cold
#       compile meanwhile training runs), waits for the trained weights, runs the tests again on them
#   then:                OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh measure [DEADLINE_S]
#       benchmarks/gpu/measure_turbomind.py on /root/ckpt (TurboMind vs PyTorch MTP off vs MTP-3)
# The grid (issue #18 items 4-5, #19 item 3), detached so that polling calls stay short:
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh grid [DEADLINE_S]
#       installs part 2, waits for the trained weights, then in the background: the sampling-correctness
#       GPU test, then measure_turbomind.py over TurboMind and PyTorch MTP off / 2 / 4 at output 512 and
#       128, concurrency 8, 64, 256, temperature 0 and 0.8, two rounds (no engine starts after DEADLINE_S);
#       GRID_CONC=256 / GRID_ROUNDS=3 / GRID_SAMPLING=0 (skip the sampling test) /
#       GRID_ENGINES=pytorch-mtp-off,pytorch-mtp2,pytorch-mtp4 (the simulator fit's engines) / GRID_WAVES=3
#       (measured waves per cell per engine start) / GRID_OUTPUT=512 narrow or widen it. The simulator fit's next
#       grid, ~18 min after t1 per lease, in two leases (the same training recipe and steps; the fit pools the runs):
#       GRID_ENGINES=pytorch-mtp-off,pytorch-mtp2,pytorch-mtp4 GRID_ROUNDS=2 GRID_WAVES=3 GRID_SAMPLING=0 ... grid 1000
#       (both output lengths: with one, the fit cannot tell prefill cost from per-sequence decode cost).
#       GRID_PROMPTS=256 sends that many requests per cell whatever the concurrency (one prompt set at every load):
#       (2026-12-02: the counted accept length rises with load over one prompt set: LMDeploy's counting), ~6 min after t1:
#       GRID_ENGINES=pytorch-mtp4 GRID_CONC=8,64,256 GRID_PROMPTS=256 GRID_OUTPUT=128 GRID_ROUNDS=1 GRID_SAMPLING=0 ... grid
#   then, until it says done:  OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh collect
#   (every *collect step waits for the job up to WAIT_S s (device_env.sh), holding the machine: call it again at once,
#   within 30 s, or the machine goes back and the detached job dies with it)
# Serving (issue #19 items 2 and 5), detached; after t1 (with training) and t2:
#   carry [".stage/r0"]: bash .stage/r0/install_part.sh
#   carry [".stage/r1"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh serve
#       installs Ray Serve, waits for the trained weights, then in the background: the TurboMind GPU tests
#       on the trained checkpoint (greedy equality token for token, partings checked for near-ties), then
#       benchmarks/gpu/serve_engines.py (a table mixing TurboMind and PyTorch MTP-2 served through Ray Serve)
#   then, until it says done:  OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh serve-collect
# Two independent sweeps and their tables side by side (issue #22 item 2), after t1 (CKPT_BUILD=... when the
# sweeps and the side by side take several leases: each sweep records its weights' sha256) and t3:
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh repro-install
#   carry [".stage/r0"]: bash .stage/r0/install_part.sh
#   carry [".stage/r1"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh repro [ARGS...]
#       installs Ray and Optuna, waits for the trained weights, starts measure_reproducibility.py in the
#       background (ARGS go to it: two sweeps of MTP off / MTP-4 over buckets 256 and 1024, T 0 and 0.8,
#       64 in flight, 5-7 min each, then both tables side by side, ~8 min with the 60-s warm-ups)
#   then, until it says done:  OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh repro-collect
#   (copies each finished sweep's routing_table.json, sweep.json and weights.json to $OUT/work/sweep-<tag>/: a later lease
#   re-measures them side by side with ARGS "--reuse --work <that folder, committed>"; one sweep per lease where
#   a decide phase fills it: "--sweeps a --no-side-by-side", then the call it prints, then "--sweeps none --reuse")
# Does a table pay on the H200 (issue #18 item 6), after t1 (with training):
#   carry [".stage/t3"]: bash .stage/t3/install_part.sh
#   carry [".stage/t2"]: source benchmarks/gpu/staging/device_env.sh && install_part2
#   carry [".stage/r0"]: bash .stage/r0/install_part.sh
#   carry [".stage/r1"]: [PAYOFF_TABLE=path] OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh payoff
#       installs Ray and Optuna, waits for the trained weights, then in the background: unless PAYOFF_TABLE
#       names a committed table of an earlier lease's sweep, a sweep of the PyTorch engine (its two
#       baselines only, MTP off and MTP-4 at fraction 0.8, each alone on the GPU; the searched space holds the
#       same two configs at 0.06 and is not reached with --num-trials 2; buckets 256 and 1024, 16 and 64 in
#       flight, T 0 and 0.8, PAYOFF_REPEATS (3) rounds, the stated mix benchmarks/gpu/payoff_mix_test_ckpt.yaml;
#       ~15 min), then benchmarks/mixed_payoff.py: the table against each of its configs alone on as many
#       engines and against the cap (each part of the mix driven alone on each config, the best routing
#       served as an app), every engine at memory fraction PAYOFF_MEMORY (0.02) so all apps are resident on
#       the GPU at once, every app warmed up by one unmeasured 60-s drive, PAYOFF_ROUNDS (4) interleaved rounds
#       of a ramp and a burst (3 apps: deploy ~5.5 min one app after another on 2026-12-02, now side by side;
#       warm-up ~3.5 min, cap selection ~2 min, a round ~2.5 min; every drive is saved as it ends, so a lease
#       that ends first keeps the rounds done). Results of
#       2026-12-02: benchmarks/results/gpu_payoff_h200_2026-12-02/ (the sweep; the payoff did not deploy) and
#       benchmarks/results/gpu_payoff_h200_2026-12-02_served/ (the re-decided table served, no warm-up yet)
#   then, until it says done:  OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh payoff-collect
# The builder's accept-length prediction against LMDeploy (issue #22 item 1), without training:
#   carry [".stage/t1"]: NO_TRAIN=1 OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t1
#   carry [".stage/t3"]: bash .stage/t3/install_part.sh
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh acceptance
#       tests/gpu/test_gpu_acceptance.py (a small MoE built on the GPU, MTP-3, T 0 and 0.8, ±0.15), ~5 min
# Where a measurement's spread comes from (issue #22 item 2), without training:
#   carry [".stage/t1"]: NO_TRAIN=1 OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t1
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh suspects [DEADLINE_S]
#       installs part 2, builds an oracle checkpoint of the test shape, runs measure_suspects.py (~6 min)
# The plain engines alone, without training (their work does not depend on the weights):
#   carry [".stage/t1"]: NO_TRAIN=1 OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t1
#   carry [".stage/t2"]: OUT=$OUT bash benchmarks/gpu/staging/turbomind_device.sh t2-plain [DEADLINE_S]
#       installs part 2, builds an oracle checkpoint of the test shape, measures TurboMind vs PyTorch
#       MTP off at concurrency 8, 64 and 256
set -u
STEP=${1:?t1, t2 or measure}
OUT=${OUT:?set OUT}
source benchmarks/gpu/staging/device_env.sh
mkdir -p /root/tm "$OUT"
[ -f /root/tm/env.sh ] && source /root/tm/env.sh

wait_for_weights() {  # the trained checkpoint (t1 started training in the background), up to 5 minutes
  for _ in $(seq 1 60); do grep -q "saved /root/ckpt/model.safetensors" /root/tm/train.log && return; sleep 5; done
}

ray_job_ready() {  # $1: the job's folder; $2: what it imports. Installs Ray's dependencies and Optuna (carried
  # .stage/r1; Ray itself came with .stage/r0 in the call before), checks the imports, waits for the trained
  # weights, clears the folder's done marker and keeps the training log there.
  [ -d /root/site/ray ] || { echo "Ray missing: carry .stage/r0 in the call before (bash .stage/r0/install_part.sh)"; exit 1; }
  bash .stage/r1/install_part.sh
  python3 -c "import $2, ray; print('ray', ray.__version__)" || exit 1
  wait_for_weights
  mkdir -p "$1" && rm -f "$1/done" && cp /root/tm/train.log "$1/"
}

case $STEP in
  t1)
    bash .stage/t1/install_part.sh
    TMLIB=/root/site/lmdeploy/turbomind/lib
    cp .stage/t1/turbomind-lib/* "$TMLIB/" && ls -la "$TMLIB"
    # The preflight's check, as an engine start runs it: loads _turbomind in a child python3.
    if python3 -c "from orchestrator.preflight import check_turbomind as c; print('TurboMind loads:', c())"; then
      echo "# TurboMind loads without LD_LIBRARY_PATH" > /root/tm/env.sh
    else
      # Fall back to the recipe's LD_LIBRARY_PATH (torch's CUDA 13 and NCCL libraries by folder).
      TL=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
      echo "export LD_LIBRARY_PATH=$TL/nvidia/cu13/lib:$TL/nvidia/nccl/lib:\${LD_LIBRARY_PATH:-}" > /root/tm/env.sh
      source /root/tm/env.sh
      python3 -c "from orchestrator.preflight import check_turbomind as c; print('TurboMind loads with LD_LIBRARY_PATH:', c())"
    fi
    cat /root/tm/env.sh | tee "$OUT/tm_env.sh"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
    [ -n "${NO_TRAIN:-}" ] && exit 0
    if [ -n "${CKPT_BUILD:-}" ]; then
      # Built, not trained: drawn on the CPU from a seed (~10 s), the same bytes in every lease (the CPU
      # kernels pinned to AVX2: another instruction set draws other bits), so leases that share a sweep's
      # tables measure one model (measure_reproducibility.py checks the sha256).
      ATEN_CPU_CAPABILITY=avx2 python3 -m tuning.checkpoint.build /root/ckpt $CKPT_BUILD --tokenizer-bytes 2097152 \
        > /root/tm/train.log 2>&1 || { tail -n 20 /root/tm/train.log; echo "the build failed"; exit 1; }
      grep -E "saved|predicted" /root/tm/train.log
      exit 0
    fi
    # Training: a new session, so it outlives this call (the machine runs it until it goes back). The
    # staged Triton (3.6) makes FLA refuse Hopper, and finding that out costs a second pass over the data
    # (~2 min): the PyTorch gated delta rule from the start.
    setsid nohup python3 -m tuning.checkpoint.train /root/ckpt --steps "${TRAIN_STEPS:-480}" --linear-kernel torch \
      > /root/tm/train.log 2>&1 < /dev/null &
    sleep 15; tail -n 3 /root/tm/train.log
    ;;
  t2)
    install_part2 || exit 1
    python3 -c "import lmdeploy, flash_attn_interface, fla; print('lmdeploy', lmdeploy.__version__)" || exit 1
    python3 benchmarks/gpu/measure_mtp.py --versions > "$OUT/versions.json" 2>&1
    set -o pipefail
    timeout 360 python3 -m pytest tests/gpu/test_gpu_turbomind.py -v -s -p no:cacheprovider -o cache_dir=/tmp/pc \
      2>&1 | tee "$OUT/gpu_tests_oracle.log" | grep -E "PASSED|FAILED|ERROR|ready in|passed|failed|prompt "
    echo "pytest (oracle) exit $?"
    wait_for_weights
    grep -E "saved|expected accept|exit|Error" /root/tm/train.log | tail -4
    cp /root/tm/train.log "$OUT/train.log"
    MTP_TEST_CHECKPOINT=/root/ckpt timeout 180 python3 -m pytest tests/gpu/test_gpu_turbomind.py -v -s -p no:cacheprovider \
      -o cache_dir=/tmp/pc 2>&1 | tee "$OUT/gpu_tests_trained.log" | grep -E "PASSED|FAILED|ERROR|ready in|passed|failed|prompt "
    echo "pytest (trained) exit $?"
    cp /root/ckpt/train_report.json /root/ckpt/mtp_expected.json "$OUT/" 2>/dev/null
    ;;
  t2-plain)
    install_part2 || exit 1
    python3 -m tuning.checkpoint.build /root/oracle --oracle --tokenizer-bytes 2097152 | tail -1
    python3 benchmarks/gpu/measure_turbomind.py --ckpt /root/oracle --out "$OUT/measure" --engines turbomind,pytorch-mtp-off \
      --concurrency 8,64,256 --deadline-s "${2:-420}" 2>&1 | tee "$OUT/measure.log" | grep -vE "^\s*$"
    tar czf "$OUT/engine-logs.tgz" -C "$OUT/measure" engine-logs && rm -rf "$OUT/measure/engine-logs"
    ;;
  suspects)
    install_part2 || exit 1
    python3 -m tuning.checkpoint.build /root/oracle --oracle --tokenizer-bytes 2097152 | tail -1
    python3 benchmarks/gpu/measure_mtp.py --versions > "$OUT/versions.json" 2>&1
    python3 docs/analyses/gpu_suspects/measure_suspects.py --ckpt /root/oracle --out "$OUT/suspects" --deadline-s "${2:-330}" \
      2>&1 | tee "$OUT/suspects.log" | grep -E "^\[suspects|^\| (quiet|cpu|busy)"
    tar czf "$OUT/engine-logs.tgz" -C "$OUT/suspects" engine-logs && rm -rf "$OUT/suspects/engine-logs"
    ;;
  measure)
    cp /root/ckpt/train_report.json /root/ckpt/mtp_expected.json "$OUT/" 2>/dev/null
    python3 benchmarks/gpu/measure_turbomind.py --ckpt /root/ckpt --out "$OUT/measure" --deadline-s "${2:-420}" \
      2>&1 | tee "$OUT/measure.log" | grep -vE "^\s*$"
    tar czf "$OUT/engine-logs.tgz" -C "$OUT/measure" engine-logs && rm -rf "$OUT/measure/engine-logs"
    ;;
  grid)
    install_part2 || exit 1
    python3 -c "import lmdeploy, flash_attn_interface, fla; print('lmdeploy', lmdeploy.__version__)" || exit 1
    wait_for_weights
    grep -E "saved|expected accept|exit|Error" /root/tm/train.log | tail -4
    # the training's report follows its weights by ~30 s: the job copies it again when it ends
    mkdir -p /root/tm/grid && rm -f /root/tm/grid/done && cp /root/tm/train.log /root/tm/grid/
    python3 benchmarks/gpu/measure_mtp.py --versions > /root/tm/grid/versions.json 2>&1
    setsid nohup bash -c "source benchmarks/gpu/staging/device_env.sh; source /root/tm/env.sh;
      [ \"${GRID_SAMPLING:-1}\" = 1 ] && MTP_TEST_CHECKPOINT=/root/ckpt timeout 700 python3 -m pytest \
        tests/gpu/test_gpu_sampling.py -v -s -p no:cacheprovider -o cache_dir=/tmp/pc > /root/tm/grid/sampling.log 2>&1;
      python3 benchmarks/gpu/measure_turbomind.py --ckpt /root/ckpt --out /root/tm/grid/measure \
        --engines ${GRID_ENGINES:-turbomind,pytorch-mtp-off,pytorch-mtp2,pytorch-mtp4} --concurrency ${GRID_CONC:-8,64,256} \
        --output-len ${GRID_OUTPUT:-512,128} --temperatures 0,0.8 --rounds ${GRID_ROUNDS:-2} --waves ${GRID_WAVES:-1} ${GRID_PROMPTS:+--num-prompts $GRID_PROMPTS} --deadline-s ${2:-900} \
        > /root/tm/grid/measure.log 2>&1;
      cp /root/ckpt/train_report.json /root/ckpt/mtp_expected.json /root/tm/train.log /root/tm/grid/ 2>/dev/null;
      touch /root/tm/grid/done" > /root/tm/grid/job.log 2>&1 < /dev/null &
    sleep 5; echo "grid started"
    ;;
  serve)
    ray_job_ready /root/tm/serve "ray.serve, lmdeploy, openai"
    grep -E "saved|expected accept|exit|Error" /root/tm/train.log | tail -4
    python3 benchmarks/gpu/measure_mtp.py --versions > /root/tm/serve/versions.json 2>&1
    setsid nohup bash -c "source benchmarks/gpu/staging/device_env.sh; source /root/tm/env.sh;
      MTP_TEST_CHECKPOINT=/root/ckpt timeout 600 python3 -m pytest tests/gpu/test_gpu_turbomind.py -v -s \
        -p no:cacheprovider -o cache_dir=/tmp/pc > /root/tm/serve/gpu_tests_trained.log 2>&1;
      timeout 900 python3 benchmarks/gpu/serve_engines.py --ckpt /root/ckpt --out /root/tm/serve \
        --work /root/tm/serve-work > /root/tm/serve/serve_engines.log 2>&1;
      touch /root/tm/serve/done" > /root/tm/serve/job.log 2>&1 < /dev/null &
    sleep 5; echo "serve job started"
    ;;
  acceptance)
    # The builder's predicted accept length against LMDeploy's measured one (issue #22 item 1), ~5 min with the
    # engine's cold start; after t1 (NO_TRAIN=1 will do) and t3.
    install_part2 || exit 1
    set -o pipefail
    timeout 540 python3 -m pytest tests/gpu/test_gpu_acceptance.py -v -s -p no:cacheprovider -o cache_dir=/tmp/pc \
      2>&1 | tee "$OUT/gpu_acceptance.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|predicted|measured"
    echo "pytest (acceptance) exit $?"
    ;;
  repro-install)
    install_part2 || exit 1
    python3 -c "import lmdeploy, flash_attn_interface, fla; print('lmdeploy', lmdeploy.__version__)" || exit 1
    ;;
  repro)
    ray_job_ready /root/tm/repro "ray.serve, ray.tune, optuna, lmdeploy, pandas"
    python3 benchmarks/gpu/measure_mtp.py --versions > /root/tm/repro/versions.json 2>&1
    shift
    W=/root/tm/repro-work  # where the sweeps' tables are (the script's --work: its last one wins)
    for x in "$@"; do [ "${prev:-}" = --work ] && W=$x; case $x in --work=*) W=${x#--work=};; esac; prev=$x; done
    echo "$W" > /root/tm/repro/work_dir
    setsid nohup bash -c "source benchmarks/gpu/staging/device_env.sh; source /root/tm/env.sh;
      python3 benchmarks/gpu/measure_reproducibility.py --ckpt /root/ckpt --out /root/tm/repro --work /root/tm/repro-work $* \
        > /root/tm/repro/repro.log 2>&1; touch /root/tm/repro/done" > /dev/null 2>&1 < /dev/null &
    sleep 5; echo "reproducibility job started"
    ;;
  payoff)
    P=/root/tm/payoff && ray_job_ready $P "ray.serve, ray.tune, optuna, lmdeploy, pandas, pyarrow"
    python3 benchmarks/gpu/measure_mtp.py --versions > $P/versions.json 2>&1
    TABLE=${PAYOFF_TABLE:-$P/sweep/routing_table.json}
    SWEEP="python3 -m tuning.sweep --model /root/ckpt --session-len 4096 --tp 1 --run-dir $P/sweep --sweep-id payoff-h200 \
        --no-live --backends pytorch --speculative false,true --num-draft-tokens ${PAYOFF_DRAFTS:-4} --num-trials 2 \
        --buckets 256,1024 --concurrency 16,64 --temperatures 0,0.8 --num-prompts 64 --repeats ${PAYOFF_REPEATS:-3} \
        --memory-fraction 0.06 --max-batch-size 64 --share-gpu --traffic-mix benchmarks/gpu/payoff_mix_test_ckpt.yaml \
        --seed 0 > $P/sweep.log 2>&1"
    [ -n "${PAYOFF_TABLE:-}" ] && SWEEP="echo 'table: $PAYOFF_TABLE (no sweep)' > $P/sweep.log"
    setsid nohup bash -c "source benchmarks/gpu/staging/device_env.sh; source /root/tm/env.sh; $SWEEP;
      python3 benchmarks/mixed_payoff.py --table $TABLE --mix benchmarks/gpu/payoff_mix_test_ckpt.yaml \
        --other-mixes '' --rounds ${PAYOFF_ROUNDS:-4} --retries 0 --levels 16,32,64 --profile-scale 0.2 --share-gpu \
        --memory-fraction ${PAYOFF_MEMORY:-0.02} --out-dir $P --name payoff_h200 --work-dir $P/work > $P/payoff.log 2>&1;
      touch $P/done" > /dev/null 2>&1 < /dev/null &
    sleep 5; echo "payoff job started"
    ;;
  payoff-collect)
    wait_done /root/tm/payoff/done
    P=/root/tm/payoff
    tail -n 3 $P/sweep.log 2>/dev/null; grep "^\[payoff" $P/payoff.log 2>/dev/null | tail -n 6
    [ -f $P/done ] && echo "PAYOFF DONE" || echo "payoff job still running"
    cp $P/*.json $P/*.log "$OUT/" 2>/dev/null
    for f in routing_table.json results.parquet; do [ -f $P/sweep/$f ] && cp $P/sweep/$f "$OUT/"; done
    [ -f $P/done ] && tar czf "$OUT/sweep_and_engine_logs.tgz" -C $P sweep work 2>/dev/null
    ;;
  repro-collect)
    wait_done /root/tm/repro/done
    grep "\[e2e" /root/tm/repro/repro.log 2>/dev/null | grep -v '\$ ' | tail -6
    [ -f /root/tm/repro/done ] && echo "REPRO DONE" || echo "reproducibility job still running"
    cp /root/tm/repro/*.json /root/tm/repro/*.log /root/tm/repro/*.tgz "$OUT/" 2>/dev/null
    W=$(cat /root/tm/repro/work_dir 2>/dev/null)
    for t in a b; do
      if [ -f "$W/sweep-$t/routing_table.json" ]; then
        mkdir -p "$OUT/work/sweep-$t" && cp "$W/sweep-$t/routing_table.json" "$W/sweep-$t/sweep.json" "$OUT/work/sweep-$t/"
        cp "$W/sweep-$t/weights.json" "$OUT/work/sweep-$t/" || echo "sweep $t has no weights.json: a later lease will not reuse its table"
      fi
    done
    ;;
  serve-collect)
    wait_done /root/tm/serve/done
    grep -E "PASSED|FAILED|ERROR|passed|failed" /root/tm/serve/gpu_tests_trained.log 2>/dev/null | tail -6
    grep "\[e2e" /root/tm/serve/serve_engines.log 2>/dev/null | tail -5
    [ -f /root/tm/serve/done ] && echo "SERVE DONE" || echo "serve job still running"
    cp /root/tm/serve/*.log /root/tm/serve/*.json "$OUT/" 2>/dev/null
    [ -f /root/tm/serve/done ] && [ -d /root/tm/serve-work/serve-logs ] && \
      tar czf "$OUT/engine-logs.tgz" -C /root/tm/serve-work serve-logs
    ;;
  collect)
    wait_done /root/tm/grid/done
    tail -n 4 /root/tm/grid/sampling.log 2>/dev/null; tail -n 3 /root/tm/grid/measure.log 2>/dev/null
    [ -f /root/tm/grid/done ] && echo "GRID DONE" || echo "grid still running"
    cp /root/tm/grid/*.log /root/tm/grid/*.json "$OUT/" 2>/dev/null
    [ -d /root/tm/grid/measure ] && cp /root/tm/grid/measure/turbomind_results.* "$OUT/" 2>/dev/null
    [ -f /root/tm/grid/done ] && [ -d /root/tm/grid/measure/engine-logs ] && \
      tar czf "$OUT/engine-logs.tgz" -C /root/tm/grid/measure engine-logs
    ;;
  *) echo "unknown step $STEP"; exit 2 ;;
esac
