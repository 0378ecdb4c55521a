#!/bin/sh
# The Python binding over verbs (tests/python/verbs_cases.py), run by
# tests/verbs/run_device_suite.sh in the Soft-RoCE VM or directly on a
# host's RDMA device (meson test -C BUILD --suite rxe rxe_python).  The VM
# boots the host's root read-only, so Debian's interpreter and its
# packages (pytest, numpy, flatbuffers) are the host's; pytest writes only
# under /tmp there.
set -u
: "${PYTHON:?PYTHON not set (tests/python/meson.build sets it)}"
HERE=$(cd -- "$(dirname -- "$0")" && pwd)
echo "python_over_verbs: $("$PYTHON" -c 'import sys, numpy, pytest, flatbuffers; print(sys.executable, sys.version.split()[0], "numpy", numpy.__version__, "pytest", pytest.__version__)')"
[ -d "/sys/class/infiniband/${SLOTRPC_DEVICE:-rxe0}" ] || {
  echo "python_over_verbs: no RDMA device ${SLOTRPC_DEVICE:-rxe0} under /sys/class/infiniband"; exit 1; }
SLOTRPC_PY_VERBS=1 PYTHONDONTWRITEBYTECODE=1 exec "$PYTHON" -m pytest -v -rs -p no:cacheprovider -p no:hypothesispytest -x \
  -o faulthandler_timeout=120 --basetemp="${TMPDIR:-/tmp}/python_over_verbs" "$HERE/verbs_cases.py"
