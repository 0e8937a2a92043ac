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

# Held until the setup exits, which writes its exit status into it: a second setup of the same
# venv waits for the first, and the real-engine tests (tests/engine_setup.py) wait for it rather
# than start on a half-built venv, and fail naming a setup that failed (.ci/run builds the
# engines while the rest of the suite runs). Without flock(1) (util-linux) there is no lock file,
# and nothing waits.
mkdir -p "$ENGINES_DIR"
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$VENV.setup.lock"
  flock 9
  : >"$VENV.setup.lock"
  trap 'echo $? >"$VENV.setup.lock"' EXIT
fi

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
