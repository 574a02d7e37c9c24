# shellcheck shell=bash
# shellcheck disable=SC2034  # SPAWNED_SID is read by the scripts that source this file
# What the launchers start and stop on a node: sessions recorded by id (Ray, the pilot's
# SGLang server, the housekeeper), and the housekeeper's pruning of dumps and checkpoints.
# Sourced by common.sh.

# ── Processes this launcher starts, recorded by session id ─────────────────────────────

# rescue_spawn NAME wait|background CMD...: run CMD as a new session whose id (its leader's
# process id) is recorded in RUN_STATE_DIR/NAME.sid; `wait` waits for CMD (its daemons stay
# in the session), `background` leaves it running and sets SPAWNED_SID. DRY_RUN=1 prints CMD.
rescue_spawn() {
  local name=$1 mode=$2
  shift 2
  if [[ $DRY_RUN == 1 ]]; then
    rescue_print_cmd "$@"
    rescue_note "$name runs as its own session, its id recorded in $RUN_STATE_DIR/$name.sid"
    SPAWNED_SID=
    return 0
  fi
  mkdir -p "$RUN_STATE_DIR"
  local record=$RUN_STATE_DIR/$name.sid
  printf '+ %s\n' "$(rescue_print_cmd "$@")" >&2
  # shellcheck disable=SC2016  # $$ and $@ belong to the new session's shell
  local leader='echo "$$" >"$0"; exec "$@"'
  if [[ $mode == wait ]]; then
    setsid -w bash -c "$leader" "$record" "$@"
  else
    setsid bash -c "$leader" "$record" "$@" &
    SPAWNED_SID=$!
  fi
}

# Process ids of the live members of session $1.
rescue_session_pids() {
  ps -e -o pid=,sid= | awk -v s="$1" '$2 == s { print $1 }'
}

# rescue_stop_recorded NAME: stop the session an earlier run recorded as NAME (TERM, then
# KILL after 30 s), and forget it. Processes of other sessions are never touched.
rescue_stop_recorded() {
  local record=$RUN_STATE_DIR/$1.sid sid pids
  [[ -f $record ]] || return 0
  sid=$(<"$record")
  [[ $sid =~ ^[1-9][0-9]*$ ]] || {
    rm -f -- "$record"
    return 0
  }
  pids=$(rescue_session_pids "$sid")
  if [[ -z $pids ]]; then
    [[ $DRY_RUN == 1 ]] || rm -f -- "$record"
    return 0
  fi
  rescue_note "stop $1 left by an earlier run: session $sid ($(wc -w <<<"$pids") processes, recorded in $record)"
  [[ $DRY_RUN == 1 ]] && return 0
  # shellcheck disable=SC2086  # one pid per word
  kill -TERM $pids 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while [[ -n $(rescue_session_pids "$sid") ]] && ((SECONDS < deadline)); do sleep 1; done
  pids=$(rescue_session_pids "$sid")
  # shellcheck disable=SC2086
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  rm -f -- "$record"
}

# ── The housekeeper: dump window and checkpoint retention, detached from this shell ─────

# Deletes the dumps of steps >= DUMP_STEPS (Miles' --save-debug-rollout-data has no limit).
rescue_prune_dumps() {
  [[ $DUMP_STEPS == 0 || $DUMP_STEPS == all ]] && return 0
  local f id
  for f in "$DUMP_DIR"/rollout_data/*.pt "$DUMP_DIR"/dashboard_columns/rollout_*.parquet; do
    [[ -e $f ]] || continue
    id=${f##*/}
    id=${id#rollout_}
    id=${id%.*}
    if [[ $id =~ ^[0-9]+$ ]] && ((10#$id >= DUMP_STEPS)); then rm -f -- "$f"; fi
  done
}

# Keeps the CKPT_KEEP newest Megatron checkpoints (SAVE_DIR/iter_NNNNNNN) and the one
# latest_checkpointed_iteration.txt names; never one newer than that (it may be half written).
rescue_prune_checkpoints() {
  ((CKPT_KEEP > 0)) || return 0
  local latest_file=$SAVE_DIR/latest_checkpointed_iteration.txt latest d n
  [[ -f $latest_file ]] || return 0
  latest=$(tr -dc '0-9' <"$latest_file")
  [[ -n $latest ]] || return 0
  local -a done=()
  for d in "$SAVE_DIR"/iter_*; do
    [[ -d $d ]] || continue
    n=${d##*/iter_}
    [[ $n =~ ^[0-9]+$ ]] && ((10#$n <= 10#$latest)) && done+=("$((10#$n)) $d")
  done
  local kept=0
  while read -r n d; do
    [[ -n $d ]] || continue
    kept=$((kept + 1))
    ((kept <= CKPT_KEEP || 10#$n == 10#$latest)) && continue
    rm -rf -- "$d"
  done < <(printf '%s\n' "${done[@]}" | sort -rn)
}

# Node 0: start launch/housekeep.sh as its own session; it prunes every HOUSEKEEP_S s until
# the Ray job SUBMISSION_ID ends, whatever happens to this shell. $1 names its record in
# RUN_STATE_DIR (default housekeeper; a sweep gives each run its own).
rescue_housekeeper() {
  local record=${1:-housekeeper}
  [[ $DUMP_STEPS == 0 || $DUMP_STEPS == all ]] && ((CKPT_KEEP == 0)) && return 0
  [[ $RAY_STOP == 1 ]] && rescue_stop_recorded "$record"
  rescue_note "until job $SUBMISSION_ID ends: keep dumps of steps < DUMP_STEPS=$DUMP_STEPS in $DUMP_DIR and the CKPT_KEEP=$CKPT_KEEP newest checkpoints in $SAVE_DIR, every HOUSEKEEP_S=$HOUSEKEEP_S s"
  [[ $DRY_RUN == 1 ]] && return 0
  mkdir -p "$OUTPUT_DIR/$RUN_NAME"
  rescue_spawn "$record" background nohup env "DUMP_DIR=$DUMP_DIR" "SAVE_DIR=$SAVE_DIR" \
    "SUBMISSION_ID=$SUBMISSION_ID" "DUMP_STEPS=$DUMP_STEPS" "CKPT_KEEP=$CKPT_KEEP" \
    "HOUSEKEEP_S=$HOUSEKEEP_S" "RAY_DASHBOARD_PORT=$RAY_DASHBOARD_PORT" "OUTPUT_DIR=$OUTPUT_DIR" \
    "RUN_STATE_DIR=$RUN_STATE_DIR" "PATH=$PATH" bash "$LAUNCH_DIR/housekeep.sh" \
    >>"$OUTPUT_DIR/$RUN_NAME/housekeeper.log" 2>&1 </dev/null
}
