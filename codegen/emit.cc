#include "emit.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <vector>

namespace slotrpc_gen {

namespace {

constexpr size_t kWidth = 100;

// `lead` "(" args ")" `trail`, filling lines up to kWidth columns: the
// continuation lines aligned after the parenthesis, or, when that does not
// fit, all arguments on lines of their own indented 4 from `lead`.
std::string wrap_at(const std::string& lead, const std::vector<std::string>& args,
                    const std::string& trail, bool break_first, size_t* longest) {
  const size_t indent = lead.find_first_not_of(' ') + 4;
  std::string out = lead + "(";
  size_t align = out.size() > 60 ? indent : out.size();
  size_t col = out.size();
  *longest = 0;
  if (break_first && !args.empty()) {
    out += '\n';
    out.append(indent, ' ');
    *longest = col;
    col = align = indent;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string piece = args[i] + (i + 1 < args.size() ? "," : ")" + trail);
    if (i != 0) {
      if (col + 1 + piece.size() > kWidth) {
        out += '\n';
        out.append(align, ' ');
        *longest = std::max(*longest, col);
        col = align;
      } else {
        out += " ";
        col += 1;
      }
    }
    out += piece;
    col += piece.size();
  }
  if (args.empty()) out += ")" + trail;
  *longest = std::max(*longest, col);
  return out + "\n";
}

std::string wrap(const std::string& lead, const std::vector<std::string>& args,
                 const std::string& trail) {
  size_t longest = 0;
  std::string aligned = wrap_at(lead, args, trail, false, &longest);
  if (longest <= kWidth) return aligned;
  return wrap_at(lead, args, trail, true, &longest);
}

// A server handler's second parameter: where its answer goes.
std::string handler_output(const std::string& rt, const Method& m, const std::string& resp) {
  return m.kind == MethodKind::kUnary ? rt + "ReplyBuilder<" + resp + ">& reply"
                                      : rt + "ServerWriter<" + resp + ">& writer";
}

// A handler's parameters and the names its wrapper passes, per kind:
//   unary   (const Req& request, ReplyBuilder<Resp>& reply, ServerCall& call)
//   server  (const Req& request, ServerWriter<Resp>& writer, ServerCall& call)
//   client  (ServerReader<Req>& reader, ReplyBuilder<Resp>& reply, ServerCall& call)
//   bidi    (ServerReaderWriter<Req, Resp>& stream, ServerCall& call)
struct HandlerShape {
  std::vector<std::string> params;
  std::string args;
  std::string registrar;
};

HandlerShape handler_shape(const std::string& rt, const Method& m, const std::string& req,
                           const std::string& resp) {
  switch (m.kind) {
    case MethodKind::kUnary:
    case MethodKind::kServerStream:
      return {{"const " + req + "& request", handler_output(rt, m, resp), rt + "ServerCall& call"},
              m.kind == MethodKind::kUnary ? "request, reply, call" : "request, writer, call",
              m.kind == MethodKind::kUnary ? "add_typed_unary" : "add_server_stream"};
    case MethodKind::kClientStream:
      return {{rt + "ServerReader<" + req + ">& reader", rt + "ReplyBuilder<" + resp + ">& reply",
               rt + "ServerCall& call"},
              "reader, reply, call", "add_client_stream"};
    case MethodKind::kBidiStream:
      return {{rt + "ServerReaderWriter<" + req + ", " + resp + ">& stream", rt + "ServerCall& call"},
              "stream, call", "add_bidi_stream"};
  }
  return {};
}

void emit_doc(std::string& out, const std::string& indent, const std::vector<std::string>& doc) {
  for (std::string line : doc) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
      line.pop_back();
    // A comment ending in a backslash would continue onto the next line of code.
    if (!line.empty() && line.back() == '\\') line += '.';
    out += indent + "///" + line + "\n";
  }
}

std::string hex(uint32_t id) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08xu", id);
  return buf;
}

std::string quote(const std::string& s) {
  // Schema identifiers are [A-Za-z0-9_] and dots: nothing to escape.
  return "\"" + s + "\"";
}

// Names as the code inside one service's namespace spells them.  The
// runtime is always ::slotrpc::  -- a namespace `slotrpc` anywhere around the
// service's (x::slotrpc, declared by any header included before) would
// capture a plain slotrpc::.
struct Scope {
  const Service& svc;
  std::string rt = "::slotrpc::";
  std::string std_ = "std::";      // flatc's own code assumes std is not shadowed
  std::set<std::string> hidden;    // bare names that mean something else in class scope

  std::string_view bfbs;           // the file's binary schema, embedded when not empty

  Scope(const Service& s, std::string_view schema) : svc(s), bfbs(schema) {
    for (const Method& m : s.methods) hidden.insert(m.cpp_name);
    for (const char* suffix : {"Descriptor", "Service", "Client"}) hidden.insert(s.name + suffix);
  }

  // A message type: bare when it lives in the service's namespace, fully
  // qualified otherwise.
  std::string type(const std::string& full) const {
    std::vector<std::string> parts = split_name(full);
    const std::string name = escape_keyword(parts.back());
    parts.pop_back();
    if (parts == svc.ns && hidden.count(name) == 0 && name != "slotrpc" && name != "std")
      return name;
    std::string q;
    for (const std::string& p : parts) q += "::" + p;
    return q + "::" + name;
  }
};

void emit_descriptor(std::string& out, const Scope& sc) {
  const Service& svc = sc.svc;
  out += "// Names and method ids (FNV-1a 32 of the full method name, as\n";
  out += "// slotrpc::method_id computes them).\n";
  out += "struct " + svc.name + "Descriptor {\n";
  out += "  static constexpr const char* kName = " + quote(svc.full_name) + ";\n";
  for (const Method& m : svc.methods) {
    out += "  static constexpr uint32_t k" + m.name + "Id = " + hex(m.id) + ";\n";
    out += "  static constexpr const char* k" + m.name + "Name = " + quote(m.full_name) + ";\n";
  }
  if (!sc.bfbs.empty()) {
    out += "  // The binary schema (flatc --schema --binary) of this file, for\n";
    out += "  // slotrpc.Reflection: definition() hands it to the server.\n";
    out += "  static constexpr unsigned char kSchema[" + std::to_string(sc.bfbs.size()) + "] = {";
    for (size_t i = 0; i < sc.bfbs.size(); ++i) {
      if (i % 16 == 0) out += "\n     ";
      char b[8];
      std::snprintf(b, sizeof b, " 0x%02x,", static_cast<unsigned char>(sc.bfbs[i]));
      out += b;
    }
    out += "\n  };\n";
  }
  out += "};\n";
  for (const Method& m : svc.methods) {
    out += wrap("static_assert", {svc.name + "Descriptor::k" + m.name + "Id == " + sc.rt +
                                      "method_id(" + quote(m.full_name) + ")"},
                ";");
  }
}

void emit_service(std::string& out, const Scope& sc) {
  const Service& svc = sc.svc;
  const std::string& rt = sc.rt;
  const std::string cls = svc.name + "Service";
  bool streams = false;
  bool reads = false;
  for (const Method& m : svc.methods) {
    streams |= m.kind == MethodKind::kServerStream || m.kind == MethodKind::kBidiStream;
    reads |= m.kind == MethodKind::kClientStream || m.kind == MethodKind::kBidiStream;
  }
  emit_doc(out, "", svc.doc);
  if (!svc.doc.empty()) out += "//\n";
  out += "// Server side: implement the methods, then register definition() with\n";
  out += "// slotrpc::Server::add_service().  A unary handler builds its reply in\n";
  out += "// reply.fbb() and Finish()es it before returning OK.\n";
  if (streams) {
    out += "// A streaming handler Write()s each message (false once the stream is\n";
    out += "// over); the status it returns ends the stream.\n";
  }
  if (reads) {
    out += "// A client-streaming or bidi handler Read()s the client's messages in\n";
    out += "// place until nullptr (the client half-closed, or reader status() says\n";
    out += "// why not); it may return before, which ends the call for the client.\n";
  }
  out += "// Handlers run on the server's fibers: they may wait for other calls\n";
  out += "// (Future::get) but should not block the thread.\n";
  out += "class " + cls + " {\n";
  out += " public:\n";
  out += "  virtual ~" + cls + "() = default;\n";
  for (const Method& m : svc.methods) {
    const std::string req = sc.type(m.request);
    const std::string resp = sc.type(m.response);
    out += "\n";
    emit_doc(out, "  ", m.doc);
    out += wrap("  virtual " + rt + "Status " + m.cpp_name, handler_shape(rt, m, req, resp).params,
                " = 0;");
  }
  out += "\n";
  out += "  // The method table for slotrpc::Server::add_service(), bound to this\n";
  out += "  // object: it must outlive the server.\n";
  out += "  " + rt + "ServiceDefinition definition() {\n";
  out += "    " + rt + "ServiceDefinition def(" + svc.name + "Descriptor::kName);\n";
  if (!sc.bfbs.empty()) out += "    def.set_schema(" + svc.name + "Descriptor::kSchema);\n";
  for (const Method& m : svc.methods) {
    const std::string req = sc.type(m.request);
    const std::string resp = sc.type(m.response);
    const HandlerShape shape = handler_shape(rt, m, req, resp);
    out += "    def." + shape.registrar + "<" + req + ", " + resp + ">(\n";
    out += wrap("        " + quote(m.name) + ", [this]", shape.params, " {");
    out += "          return " + m.cpp_name + "(" + shape.args + ");\n";
    out += "        });\n";
  }
  out += "    return def;\n";
  out += "  }\n";
  out += "};\n";
}

void emit_client(std::string& out, const Scope& sc) {
  const Service& svc = sc.svc;
  const std::string& rt = sc.rt;
  const std::string& sd = sc.std_;
  const std::string cls = svc.name + "Client";
  emit_doc(out, "", svc.doc);
  if (!svc.doc.empty()) out += "//\n";
  out += "// Client side, over a slotrpc::Channel that must outlive it.  `build`\n";
  out += "// returns the request's root; it runs on the channel's event loop when a\n";
  out += "// send slot is free, possibly after the call returned: capture by value.\n";
  out += "// Unary methods come in two forms: a Future, or a `done` callback that runs\n";
  out += "// on the channel's event loop.\n";
  out += "class " + cls + " {\n";
  out += " public:\n";
  out += "  explicit " + cls + "(" + rt + "Channel& channel) : channel_(channel) {}\n";
  for (const Method& m : svc.methods) {
    const std::string req = sc.type(m.request);
    const std::string resp = sc.type(m.response);
    const std::string id = svc.name + "Descriptor::k" + m.name + "Id";
    const std::string build = rt + "Build<" + req + "> build";
    const std::string idem =
        "    options.idempotent = true;  // (idempotent) in the schema: options.max_retries apply\n";
    // The name for the client's own statuses and metrics: a pointer to
    // the descriptor's literal, nothing copied per call.
    const std::string named = "    options.method_name = " + svc.name + "Descriptor::k" + m.name + "Name;\n";
    out += "\n";
    emit_doc(out, "  ", m.doc);
    if (m.kind == MethodKind::kUnary) {
      const std::string future = rt + "Future<" + rt + "Reply<" + resp + ">>";
      out += wrap("  " + future + " " + m.cpp_name, {build, rt + "CallOptions options = {}"}, " {");
      out += named;
      if (m.idempotent) out += idem;
      out += wrap("    return channel_.unary<" + req + ", " + resp + ">",
                  {id, sd + "move(build)", sd + "move(options)"}, ";");
      out += "  }\n";
      out += wrap("  " + rt + "CallHandle " + m.cpp_name,
                  {build, rt + "CallOptions options",
                   sd + "function<void(" + rt + "Reply<" + resp + ">&&)> done"},
                  " {");
      out += named;
      if (m.idempotent) out += idem;
      out += wrap("    return channel_.unary<" + req + ", " + resp + ">",
                  {id, sd + "move(build)", sd + "move(options)", sd + "move(done)"}, ";");
      out += "  }\n";
    } else if (m.kind == MethodKind::kClientStream) {
      out += "  // Client streaming: Write() each message (false once the call is over),\n";
      out += "  // then Finish() half-closes and waits for the reply.\n";
      out += wrap("  " + rt + "ClientWriter<" + req + ", " + resp + "> " + m.cpp_name,
                  {rt + "CallOptions options = {}"}, " {");
      out += named;
      out += wrap("    return channel_.client_stream<" + req + ", " + resp + ">",
                  {id, sd + "move(options)"}, ";");
      out += "  }\n";
    } else if (m.kind == MethodKind::kBidiStream) {
      out += "  // Bidi streaming: Write()/WritesDone() and Read() independently (from\n";
      out += "  // two threads if both may wait); Finish() returns the final status.\n";
      out += wrap("  " + rt + "ClientReaderWriter<" + req + ", " + resp + "> " + m.cpp_name,
                  {rt + "CallOptions options = {}"}, " {");
      out += named;
      out += wrap("    return channel_.bidi_stream<" + req + ", " + resp + ">",
                  {id, sd + "move(options)"}, ";");
      out += "  }\n";
    } else {
      out += "  // Server streaming: Read() until nullopt, then status() tells how it ended.\n";
      out += "  // Drop each message when done with it: the server may then send more.\n";
      out += wrap("  " + rt + "ClientReader<" + resp + "> " + m.cpp_name,
                  {build, rt + "CallOptions options = {}"}, " {");
      out += named;
      if (m.idempotent) out += idem;
      out += wrap("    return channel_.server_stream<" + req + ", " + resp + ">",
                  {id, sd + "move(build)", sd + "move(options)"}, ";");
      out += "  }\n";
    }
  }
  out += "\n";
  out += " private:\n";
  out += "  " + rt + "Channel& channel_;\n";
  out += "};\n";
}

void open_ns(std::string& out, const std::vector<std::string>& ns) {
  for (const std::string& n : ns) out += "namespace " + n + " {\n";
  if (!ns.empty()) out += "\n";
}

void close_ns(std::string& out, const std::vector<std::string>& ns) {
  if (!ns.empty()) out += "\n";
  for (auto it = ns.rbegin(); it != ns.rend(); ++it) out += "}  // namespace " + *it + "\n";
}

}  // namespace

std::string emit_header(const FileModel& model, const std::string& source, const std::string& stem,
                        std::string_view bfbs) {
  std::string out;
  out += "// " + stem + ".slotrpc.h: slotrpc services of " + source + ".\n";
  out += "// Generated by slotrpc-gen from " + source + "; do not edit (change the schema\n";
  out += "// and regenerate).  The message types come from " + stem + "_generated.h\n";
  out += "// (flatc --cpp).\n";
  out += "#pragma once\n\n";
  if (model.services.empty()) {
    out += "#include \"" + stem + "_generated.h\"\n\n";
    out += "// " + source + " declares no rpc_service.\n";
    return out;
  }
  out += "#include <slotrpc/slotrpc.h>\n\n";
  out += "#include <cstdint>\n#include <functional>\n#include <utility>\n\n";
  out += "#include \"" + stem + "_generated.h\"\n";

  const std::vector<std::string>* open = nullptr;
  for (const Service& svc : model.services) {
    if (open == nullptr || *open != svc.ns) {
      if (open != nullptr) close_ns(out, *open);
      out += "\n";
      open_ns(out, svc.ns);
      open = &svc.ns;
    } else {
      out += "\n";
    }
    const Scope sc(svc, bfbs);
    std::string title = "// service " + svc.full_name + " ";
    if (title.size() < 80) title += std::string(80 - title.size(), '-');
    out += title + "\n\n";
    emit_descriptor(out, sc);
    out += "\n";
    emit_service(out, sc);
    out += "\n";
    emit_client(out, sc);
  }
  if (open != nullptr) close_ns(out, *open);
  return out;
}

}  // namespace slotrpc_gen
