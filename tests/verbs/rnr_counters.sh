# Sourced (POSIX sh) by run_verbs_tests.sh and echo_over_verbs.sh, and by
# device_suite_choice_test.sh, which feeds it fake sysfs trees.
#
# Which receiver-not-ready (RNR) counters a device's port exposes. slotrpc's
# credits keep a receive posted for every message, so these must not move.
#   rxe (Soft-RoCE): hw_counters/rcvd_rnr_err (RNR NAKs received) and
#     hw_counters/send_rnr_err (RNR NAKs sent): exactly these two, always.
#   any other device: every counter under hw_counters/ or counters/ whose
#     name contains "rnr" (mlx5: rnr_nak_retry_err, RNR NAKs received;
#     req_rnr_retries_exceeded on newer kernels), plus hw_counters/out_of_buffer
#     (mlx5: messages that found no posted receive, i.e. what makes a
#     responder send an RNR NAK).
# A device may expose none; callers then say so instead of comparing.

# rnr_counter_names PORTDIR: the counters, relative to PORTDIR, on one line
# separated by spaces (names hold no spaces); nothing when there are none.
rnr_counter_names() {
  if [ -r "$1/hw_counters/rcvd_rnr_err" ] && [ -r "$1/hw_counters/send_rnr_err" ]; then
    echo "hw_counters/rcvd_rnr_err hw_counters/send_rnr_err"
    return
  fi
  _out=
  for _f in "$1"/hw_counters/*[Rr][Nn][Rr]* "$1"/hw_counters/out_of_buffer "$1"/counters/*[Rr][Nn][Rr]*; do
    [ -f "$_f" ] && [ -r "$_f" ] && _out="$_out${_out:+ }${_f#"$1"/}"
  done
  [ -z "$_out" ] || echo "$_out"
}

# rnr_read PORTDIR NAME...: "NAME=VALUE ..." (VALUE "?" when unreadable).
rnr_read() {
  _d=$1
  shift
  _out=
  for _n in "$@"; do
    _v=$(cat "$_d/$_n" 2>/dev/null) || _v="?"
    _out="$_out${_out:+ }$_n=$_v"
  done
  echo "$_out"
}

# rnr_deltas BEFORE AFTER (two rnr_read results of the same names): prints
# "name +N, name +N" (names without their directory); returns 1 when a
# counter moved or could not be read.
rnr_deltas() {
  _moved=0
  _out=
  for _a in $2; do
    _n=${_a%%=*}
    _v1=${_a#*=}
    _v0=?
    for _b in $1; do
      [ "${_b%%=*}" = "$_n" ] && _v0=${_b#*=}
    done
    case "$_v0$_v1" in
      *[!0-9]* | "")
        _out="$_out${_out:+, }${_n##*/} unreadable ($_v0 -> $_v1)"
        _moved=1
        continue
        ;;
    esac
    _delta=$((_v1 - _v0))
    [ "$_delta" -eq 0 ] || _moved=1
    _out="$_out${_out:+, }${_n##*/} +$_delta"
  done
  echo "$_out"
  return $_moved
}
