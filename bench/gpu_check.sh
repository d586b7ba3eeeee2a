#!/usr/bin/env bash
# Issue 33's GPU checks on a GPU machine without network (recipe: shared/notes/gpu-device.md):
# pytest -m gpu, the CPU tests of the GPU split and transport there, the issue's cases timed
# (bench/gpu_cases.py, with the rank template and without), and where a cold start goes on CPU
# ranks, with the template and without, beside torchrun (bench/cells.py).
# Run from the checkout's root: WHL=<wheels folder> OUT=<results folder> bash bench/gpu_check.sh
set -o pipefail
WHL=${WHL:-../.whl}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT" "$HOME/bin" "$HOME/jp/kernels"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/site" "$WHL"/*.whl || exit 1
ln -sf "$(command -v python3)" "$HOME/bin/python"
cp -r kernels/jupyter_mn "$HOME/jp/kernels/"
export PYTHONPATH="$HOME/site:$PWD" PATH="$HOME/bin:$HOME/site/bin:$PATH" JUPYTER_PATH="$HOME/jp"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
step() { echo; echo "=== $* ($(date +%T))"; }
step pytest -m gpu
python3 -m pytest -p no:cacheprovider -m gpu -q tests/node/test_gpu.py tests/kernel/test_doctor.py
step CPU tests of the split, transport, bench
python3 -m pytest -p no:cacheprovider -q tests/node/test_visible.py tests/node/test_nccl.py \
  tests/kernel/test_bandwidth.py tests/node/test_telemetry.py -k "not telemetry or one_node"
step the issue\'s cases
timeout 100 python3 -m bench.gpu_cases "$OUT"
step the issue\'s cases, ranks started anew \(no rank template\)
mkdir -p "$OUT/no-template"; JUPYTER_MN_RANK_TEMPLATE=0 timeout 80 python3 -m bench.gpu_cases "$OUT/no-template"
step cold start on CPU ranks, with and without the rank template, beside torchrun
CUDA_VISIBLE_DEVICES= timeout 90 python3 -m bench.cells --warm 0 --cold 0 --phases 3
step done
