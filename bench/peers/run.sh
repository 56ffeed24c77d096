#!/usr/bin/env bash
# Peer benchmark: recps against PyTorch eager and TorchRec on the same DLRM,
# the same synthetic Criteo TSV data, interleaved rounds (docs/performance.md).
#
#   bench/peers/run.sh [--configs=S-p1,S-p20,M-p1|panel|...] [--systems=...]
#                      [--rounds=3] [--steps=N] [--quick] [--smoke] [--self_test] ...
#
# Creates (once) a virtual environment in $PEERS_VENV (default
# build/peers-venv) with pinned torch (PyPI), torchrec and fbgemm-gpu-cpu, or
# numpy alone when no torch peer is asked for (--systems=recps-... or
# --self_test), then runs bench/peers/peers.py with the arguments. recps
# binaries come from $BUILD_DIR/bin (default build/bin). PyPI must be
# reachable the first time.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
VENV=${PEERS_VENV:-$BUILD_DIR/peers-venv}
PY=${PYTHON:-python3}

# Versions that resolve together (fbgemm-gpu-cpu 1.9 is built against torch
# 2.14; torchrec 1.9.2 pins fbgemm 1.9). torchrec asks for the CUDA
# fbgemm-gpu package, which would overwrite the CPU one: it is installed
# without dependencies and its other dependencies are listed here.
TORCH=torch==2.14.1
FBGEMM=fbgemm-gpu-cpu==1.9.0
TORCHREC=torchrec==1.9.2
TORCHREC_DEPS=(tensordict==0.15.3 torchmetrics==1.0.3 pyre-extensions==0.0.32
               tqdm numpy)

# Only the torch peers need torch (GBs: PyPI's wheel pulls the CUDA libraries);
# recps systems alone and the self test need numpy.
need_torch=1
for arg in "$@"; do
  case $arg in
    --systems=*) if [[ ,${arg#--systems=}, =~ ,(pytorch|torchrec) ]]; then need_torch=1; else need_torch=0; fi ;;
    --self_test) need_torch=0 ;;
  esac
done

if (( need_torch )); then
  if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import torchrec, fbgemm_gpu' 2>/dev/null; then
    echo "peers: creating $VENV (torch, fbgemm-gpu-cpu, torchrec from PyPI)" >&2
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "$TORCH" "$FBGEMM"
    "$VENV/bin/pip" install -q "${TORCHREC_DEPS[@]}"
    "$VENV/bin/pip" install -q --no-deps "$TORCHREC"
    "$VENV/bin/python" -c 'import torch, torchrec, fbgemm_gpu; print("peers: torch", torch.__version__, "torchrec", torchrec.__version__ if hasattr(torchrec, "__version__") else "?")' >&2
  fi
elif [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import numpy' 2>/dev/null; then
  echo "peers: creating $VENV (numpy from PyPI; the torch peers' packages come with a run of them)" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q numpy
fi
exec "$VENV/bin/python" bench/peers/peers.py --build_dir="$BUILD_DIR" "$@"
