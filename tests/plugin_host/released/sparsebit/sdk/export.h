#pragma once
/// \file
/// Symbol visibility. Everything is hidden by default; the core library exports its public API
/// with SPARSEBIT_API and a plugin exports exactly one symbol, its descriptor entry point.

#define SPARSEBIT_API __attribute__((visibility("default")))
#define SPARSEBIT_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))
