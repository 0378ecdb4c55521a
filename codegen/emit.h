// slotrpc-gen: the generated C++ header.
#pragma once

#include <string>

#include "model.h"

namespace slotrpc_gen {

// The text of <stem>.slotrpc.h for `model`; `source` is the schema's file
// name as the header comment names it ("kv.fbs").
std::string emit_header(const FileModel& model, const std::string& source, const std::string& stem);

}  // namespace slotrpc_gen
