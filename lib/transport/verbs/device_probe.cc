#include "transport/verbs/device_probe.h"

#include <infiniband/verbs.h>

namespace slotrpc::transport::verbs {

std::vector<std::string> list_devices() {
  std::vector<std::string> names;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

std::string describe_devices() {
  const auto names = list_devices();
  if (names.empty()) return "none";
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace slotrpc::transport::verbs
