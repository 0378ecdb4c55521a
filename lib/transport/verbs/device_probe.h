// Which RDMA devices this host has (rdma-core's device list).  Used by
// transport auto-selection and its log line.
#pragma once

#include <string>
#include <vector>

namespace slotrpc::transport::verbs {

// Names of the RDMA devices libibverbs finds ("mlx5_0", "rxe0", ...); empty
// when there are none or the kernel has no RDMA support.
std::vector<std::string> list_devices();

// "none" or "mlx5_0, mlx5_1".
std::string describe_devices();

}  // namespace slotrpc::transport::verbs
