# Sourced by setup_sglang.sh and setup_vllm.sh (after `set -euo pipefail`), with VENV_NAME set:
# the paths both use and pip_install.
#
#   REPO         this repository
#   ENGINES_DIR  $FASTPP_ENGINES_DIR, default <repo>/.engines
#   VENV         $ENGINES_DIR/$VENV_NAME
#   PYTHON       the interpreter that creates the venv ($PYTHON, default python3)
#   START        when the setup started (seconds since the epoch)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ENGINES_DIR=${FASTPP_ENGINES_DIR:-$REPO/.engines}
VENV=$ENGINES_DIR/$VENV_NAME
PYTHON=${PYTHON:-python3}
START=$(date +%s)

# pip in $VENV, quiet; drops the expected notes about the local index folders it skips (one per
# package) and the stderr lines matching any pattern in PIP_EXPECTED (a script's own expected noise).
PIP_EXPECTED=()
pip_install() {
  local status=0 pattern
  local filters=(-e "is ignored: it is neither a file nor a directory")
  for pattern in "${PIP_EXPECTED[@]}"; do filters+=(-e "$pattern"); done
  "$VENV/bin/python" -m pip install -q "$@" 2>"$VENV/.pip-stderr" || status=$?
  grep -v "${filters[@]}" "$VENV/.pip-stderr" >&2 || true
  return $status
}
