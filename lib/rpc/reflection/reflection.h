// slotrpc.Reflection (reflection_service.fbs): the names of the services a server
// runs and each one's binary schema, which slotrpc-gen embeds in the code
// it generates (ServiceDefinition::schema).  With them a tool turns JSON
// into a request and a reply into JSON through FlatBuffers' own reflection
// (tools/slotrpc-cli), with no compiled client.  Every Server runs it, like
// slotrpc.Health: a schema tells no more than the method ids on the wire.
#pragma once

#include <memory>
#include <vector>

#include "slotrpc/service.h"

namespace slotrpc::reflect {

class ReflectionServiceImpl;
// `services`: the server's definitions, read at each call (the server adds
// none after start()).
std::shared_ptr<ReflectionServiceImpl> make_service(
    const std::vector<std::unique_ptr<ServiceDefinition>>* services);
ServiceDefinition definition(ReflectionServiceImpl& impl);

}  // namespace slotrpc::reflect
