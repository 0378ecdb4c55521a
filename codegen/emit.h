// slotrpc-gen: the generated C++ header.
#pragma once

#include <string>
#include <string_view>

#include "model.h"

namespace slotrpc_gen {

// The text of <stem>.slotrpc.h for `model`; `source` is the schema's file
// name as the header comment names it ("kv.fbs"); `bfbs`, the file's binary
// schema, is embedded in each service's descriptor (kSchema) and handed to
// the server by definition(), for slotrpc.Reflection.
std::string emit_header(const FileModel& model, const std::string& source, const std::string& stem,
                        std::string_view bfbs);

}  // namespace slotrpc_gen
