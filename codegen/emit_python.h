// slotrpc-gen --python: the generated Python module.
#pragma once

#include <string>

#include "model.h"

namespace slotrpc_gen {

// The text of <stem>_slotrpc.py for `model`: per service a <Svc>Servicer
// to subclass, a <Svc>Stub over a slotrpc.Channel (grpcio's shapes) and
// add_<Svc>Servicer_to_server.  It imports the message classes flatc
// --python writes next to it; `source` names the schema in the header.
std::string emit_python(const FileModel& model, const std::string& source);

}  // namespace slotrpc_gen
