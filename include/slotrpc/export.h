// SLOTRPC_API marks the public API that libslotrpc.so exports.
//
// The library is compiled with -fvisibility=hidden and
// -fvisibility-inlines-hidden, so nothing else leaves it: not Boost, fmt or
// spdlog (they are linked in, not part of the interface) and not the
// internal layers (core, transport, reactor, metrics, monitor, rpc).  A
// smaller symbol table loads faster, and an application can link its own
// Boost or fmt of another version without clashes.
//
// Rule: a public class with out-of-line members (or a vtable or typeinfo
// defined in the library) gets SLOTRPC_API after `class`/`struct`; a public
// free function defined in the library gets it in front of its declaration.
// Everything defined in the headers themselves needs nothing.  A private
// implementation class declared inside an exported class (`struct Impl;`)
// gets SLOTRPC_LOCAL, or it would be exported with its enclosing class.
// lib/slotrpc.map then keeps everything outside namespace slotrpc out (std::
// template instantiations, Boost names its headers mark visible).
// tests/symbols_test.cc fails if the shared library exports anything that is
// not a public slotrpc:: name.
#pragma once

#if defined(_WIN32)
#define SLOTRPC_API  // not a supported platform; keeps the headers parseable
#define SLOTRPC_LOCAL
#else
#define SLOTRPC_API [[gnu::visibility("default")]]
#define SLOTRPC_LOCAL [[gnu::visibility("hidden")]]
#endif
