# Phase timing for .ci/run and scripts/test-all (sourced, not run).
#
#   phase NAME COMMAND...       runs COMMAND as the phase NAME and records its wall seconds
#   phase_background NAME LOG COMMAND...
#                               the same in the background, its output in LOG; phase_wait collects it
#   phase_wait                  waits for every background phase: prints the log of each, fails if one did
#
# Each phase appends "NAME<TAB>SECONDS<TAB>ok|FAILED" to the file $MESHCA_PHASES when it is set (.ci/run
# sets it and prints the table at its end); without it the phases just run. A phase that fails stops the
# script (set -e); the EXIT trap that phases_trap installs records it as FAILED first.

_phase_name=""
_phase_start=""

_phase_record() {
  local status=$1
  if [ -n "${MESHCA_PHASES:-}" ] && [ -n "$_phase_name" ]; then
    local now=$EPOCHREALTIME
    awk -v name="$_phase_name" -v start="$_phase_start" -v end="$now" -v status="$status" \
      'BEGIN { printf "%s\t%.1f\t%s\n", name, end - start, status }' >> "$MESHCA_PHASES"
  fi
  _phase_name=""
}

# Records the phase that was running when the script exits early as FAILED.
phases_trap() {
  trap '_phase_status=$?; [ -z "$_phase_name" ] || _phase_record FAILED; exit $_phase_status' EXIT
}

phase() {
  _phase_name=$1
  shift
  _phase_start=$EPOCHREALTIME
  echo "--- phase: $_phase_name"
  "$@"
  _phase_record ok
}

_phase_jobs=()
_phase_logs=()
phase_background() {
  local name=$1 log=$2
  shift 2
  (
    phases_trap
    phase "$name" "$@"
  ) > "$log" 2>&1 &
  _phase_jobs+=("$!")
  _phase_logs+=("$log")
  echo "--- phase (in the background, output in $log): $name"
}

phase_wait() {
  local i failed=0
  for i in "${!_phase_jobs[@]}"; do
    if ! wait "${_phase_jobs[$i]}"; then
      failed=1
      echo "--- FAILED: the phase whose output (${_phase_logs[$i]}) follows" >&2
    fi
    cat "${_phase_logs[$i]}"
  done
  _phase_jobs=()
  _phase_logs=()
  return "$failed"
}
