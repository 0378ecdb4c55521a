// The server's methods by id, frozen when the server starts.  Sessions on
// every reactor read it without locks because it never changes afterwards.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "slotrpc/service.h"

namespace slotrpc::core {

class MethodTable {
 public:
  // Fails if two methods share an id (a name collision or a duplicate).
  Status add(const ServiceDefinition& service) {
    for (const MethodDescriptor& m : service.methods()) {
      auto [it, inserted] = by_id_.emplace(m.id, &m);
      if (!inserted) {
        return Status(StatusCode::kInvalidArgument,
                      "method " + m.full_name + " has the same id as " + it->second->full_name);
      }
    }
    return {};
  }
  const MethodDescriptor* find(uint32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<uint32_t, const MethodDescriptor*> by_id_;
};

}  // namespace slotrpc::core
