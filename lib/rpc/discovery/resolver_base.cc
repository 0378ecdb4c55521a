// Resolver's out-of-line destructor (slotrpc/resolver.h), the one symbol of
// the interface the etcd resolver needs.  The resolver registry
// (register_resolver, built in lib/rpc/ with multi-endpoint channels)
// defines the rest; when both are in the tree, this file goes and the
// registry's definition stays.
#include "slotrpc/resolver.h"

namespace slotrpc {

Resolver::~Resolver() = default;

}  // namespace slotrpc
