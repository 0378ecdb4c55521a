#!/bin/sh
# Run by run_verbs_tests.sh (in the Soft-RoCE VM or on a host's device):
# tests/bulk/bulk_call_test over verbs.  The binary takes its transport
# from SLOTRPC_TRANSPORT and checks that its channels really use it, so it
# cannot pass over TCP here.  Covers bulk calls end to end on verbs: RDMA
# READ of request data, RDMA WRITE into reply destinations, and a handler
# that tries a call's memory after the call ended (its window is
# invalidated: a remote access error, the memory untouched).
set -u
: "${BULK_CALL_TEST:?BULK_CALL_TEST not set}"
SLOTRPC_TRANSPORT=verbs exec "$BULK_CALL_TEST" "$@"
