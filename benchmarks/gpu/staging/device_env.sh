# Environment on the lent H200 after the wheels are installed into /root/site; source it from the
# repository root:   source benchmarks/gpu/staging/device_env.sh
# (`pip install --target` writes no console scripts; EngineConfig.command() runs
# `python -m lmdeploy serve api_server ...`, so none is needed.)
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH

# A detached job dies with the machine, and the machine goes back 30 s after a device call ends: a
# polling call must hold it until the job is done. Waits until FILE exists or WAIT_S (default 540) pass.
wait_done() {
  local end=$((SECONDS + ${WAIT_S:-540}))
  while [ ! -f "$1" ] && [ $SECONDS -lt $end ]; do sleep 3; done
}

# Part 2 (TileLang), after part 3 (z3, which TileLang imports) arrived in the call before: installs the carried
# part and says which call is missing instead of failing later inside LMDeploy.
install_part2() {
  [ -f .stage/t2/install_part.sh ] || { echo "part 2 missing: carry .stage/t2 in this call"; return 1; }
  bash .stage/t2/install_part.sh || return 1
  python3 -c "import z3" 2>/dev/null \
    || { echo "z3 missing: carry .stage/t3 in the call before (bash .stage/t3/install_part.sh), then .stage/t2"; return 1; }
  [ -d /root/site/tilelang ] || { echo "TileLang did not install from .stage/t2"; return 1; }
}
