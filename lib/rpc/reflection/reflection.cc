#include "rpc/reflection/reflection.h"

#include <fmt/format.h>

#include <algorithm>

#include "reflection_service.slotrpc.h"  // slotrpc-gen reflection_service.fbs, at build time

namespace slotrpc::reflect {

class ReflectionServiceImpl final : public ReflectionService {
 public:
  explicit ReflectionServiceImpl(const std::vector<std::unique_ptr<ServiceDefinition>>* services)
      : services_(services) {}

  Status ListServices(const ListServicesRequest&, ReplyBuilder<ListServicesReply>& reply, ServerCall&) override {
    std::vector<std::string> names;
    for (const auto& s : *services_) names.push_back(s->name());
    std::sort(names.begin(), names.end());
    auto& b = reply.fbb();
    reply.Finish(CreateListServicesReply(b, b.CreateVectorOfStrings(names)));
    return {};
  }

  Status ServiceSchema(const ServiceSchemaRequest& request, ReplyBuilder<ServiceSchemaReply>& reply,
                       ServerCall&) override {
    const std::string name = request.service() != nullptr ? request.service()->str() : "";
    for (const auto& s : *services_) {
      if (s->name() != name) continue;
      if (s->schema().empty()) {
        return Status(StatusCode::kNotFound,
                      fmt::format("service '{}' has no schema: it was registered without slotrpc-gen's code "
                                  "(ServiceDefinition::set_schema)",
                                  name));
      }
      auto& b = reply.fbb();
      reply.Finish(CreateServiceSchemaReply(b, b.CreateString(name),
                                            b.CreateVector(s->schema().data(), s->schema().size())));
      return {};
    }
    return Status(StatusCode::kNotFound, fmt::format("this server runs no service '{}'", name));
  }

 private:
  const std::vector<std::unique_ptr<ServiceDefinition>>* services_;
};

std::shared_ptr<ReflectionServiceImpl> make_service(const std::vector<std::unique_ptr<ServiceDefinition>>* services) {
  return std::make_shared<ReflectionServiceImpl>(services);
}

ServiceDefinition definition(ReflectionServiceImpl& impl) { return impl.definition(); }

}  // namespace slotrpc::reflect
