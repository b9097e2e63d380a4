# Environment on the lent H200 after the wheels are installed into /root/site; source it from the
# repository root:   source benchmarks/gpu/device_env.sh
# (`pip install --target` writes no console scripts; EngineConfig.command() runs
# `python -m lmdeploy serve api_server ...`, so none is needed.)
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH
