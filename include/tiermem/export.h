// TIERMEM_EXPORT marks the public API of libtiermem. The library is built with
// hidden symbol visibility (-fvisibility=hidden), so only what carries this
// mark is exported from libtiermem.so; everything else (the protocol, the
// transport, protobuf's generated code) stays internal to it.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TIERMEM_EXPORT [[gnu::visibility("default")]]
#else
#define TIERMEM_EXPORT
#endif

// For members of an exported class that only the library itself calls.
#if defined(__GNUC__) || defined(__clang__)
#define TIERMEM_NO_EXPORT [[gnu::visibility("hidden")]]
#else
#define TIERMEM_NO_EXPORT
#endif
