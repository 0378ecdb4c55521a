#!/bin/sh
# Run by run_verbs_tests.sh (in the Soft-RoCE VM or on a host's device):
# examples/tensor over verbs (tests/tensor_example.sh with
# SLOTRPC_TRANSPORT=verbs): Put pulls the tensor with RDMA READ, Get pushes
# it with RDMA WRITE, Reduce reads through the server's scratch buffer,
# every byte checked.  TENSOR_SIZE (tests/verbs/meson.build) is small: the
# VM moves about 36 MB/s.  scripts/tensor_rxe.sh runs 1 GiB.
set -u
SLOTRPC_TRANSPORT=verbs exec "$(dirname "$0")/../tensor_example.sh" "$@"
