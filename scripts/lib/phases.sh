# Phase times for the set-up and test scripts (sourced). `phase NAME COMMAND...` runs COMMAND,
# prints how long it took and adds the line to a log that the outermost script of the run owns
# (DTRAIN_PHASE_LOG, inherited by the scripts it calls); `phase_summary` prints the whole log there,
# so a newcomer sees where the minutes went (packages, configure, build, install, tests...).
if [[ -z ${DTRAIN_PHASE_LOG:-} ]]; then
  DTRAIN_PHASE_LOG=$(mktemp /tmp/dtrain-phases.XXXXXX)
  DTRAIN_PHASE_OWNER=$$
  export DTRAIN_PHASE_LOG DTRAIN_PHASE_OWNER
fi

phase() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  printf '%-28s %5d s%s\n' "$name" $((SECONDS - start)) "$( ((rc == 0)) || echo "  (failed: exit $rc)")" |
    tee -a "$DTRAIN_PHASE_LOG" | sed 's/^/== phase: /'
  return "$rc"
}

phase_summary() {
  [[ ${DTRAIN_PHASE_OWNER:-} == "$$" && -f $DTRAIN_PHASE_LOG ]] || return 0
  echo "== phase times =="
  cat "$DTRAIN_PHASE_LOG"
  rm -f "$DTRAIN_PHASE_LOG"
}
