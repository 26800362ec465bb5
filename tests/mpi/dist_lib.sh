# tests/mpi/dist_lib.sh — what the mpi suite's run scripts share (after
# tests/lib.sh): the skip without MPI, $MPIRUN (passing SPARQ_DIST_DELAY_MS on,
# 0 unless a command sets it), a cleanup that also kills the ranks of the
# test's bundles, finding a rank's process, waiting for mpirun, checking that
# no rank is left, and a generation whose rank is stopped (SIGSTOP) mid-way.
# stall() reads $SPARQ and $P from the script.
need_mpi
MPIRUN="mpirun --oversubscribe -x SPARQ_DIST_DELAY_MS"
export SPARQ_DIST_DELAY_MS=0
# at exit, every process of the test's bundles (the ranks mpirun started)
cleanup() { pkill -9 -f "$T/" 2>/dev/null; rm -rf "$T"; }

# the pid of rank R of the sparq job whose bundle is $1
rank_pid() {
  for p in $(pgrep -f "sparq run $1"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo $p; return; fi
  done
}
# wait up to 20 s until file $1 has output (the generation has started)
started() {
  i=0
  while [ ! -s "$1" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
  sleep 0.5
}
# wait for mpirun ($1) up to $2 s; sets RC to its exit status, 999 if it is still running
# (not through $(...): a subshell cannot wait for this shell's child, its wait says 127)
running() { [ -e "/proc/$1" ] && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null; } # an exited child is a zombie until waited for
wait_for() {
  i=0
  while running "$1" && [ $i -lt $(($2 * 10)) ]; do sleep 0.1; i=$((i+1)); done
  if running "$1"; then RC=999; else wait "$1"; RC=$?; fi
}
# no sparq process of bundle $1 is left (after $2)
none_left() {
  sleep 0.5
  [ -z "$(pgrep -f "sparq run $1")" ] && ok || bad "$2: sparq processes left behind"
  pkill -9 -f "sparq run $1" 2>/dev/null
}

# stall NAME NP BUNDLE RANK TIMEOUT: a generation on NP ranks with --timeout TIMEOUT, rank RANK
# stopped (SIGSTOP) once it has started; waits up to 30 s for mpirun, sets RC (999: still running)
# and SECS (how long every rank took to end after the stop); stderr in $T/NAME.err
stall() {
  SPARQ_DIST_DELAY_MS=20 $MPIRUN -np $2 "$SPARQ" run "$3" -p "$P" -n 4000 --ignore-eos --temp 0 -t 1 --timeout $5 \
    >"$T/$1.out" 2>"$T/$1.err" &
  mp=$!
  started "$T/$1.out"
  victim=$(rank_pid "$3" $4)
  [ -n "$victim" ] && ok || bad "$1: rank $4 not found"
  [ -n "$victim" ] && kill -STOP "$victim"
  t0=$(date +%s)
  wait_for $mp 30
  SECS=$(( $(date +%s) - t0 ))
  [ "$RC" != 999 ] && [ "$RC" != 0 ] && ok || bad "$1: mpirun exit '$RC' (999 = still running after 30 s)"
  echo "--- $1: what the ranks and mpirun said:"; cat "$T/$1.err"
}
