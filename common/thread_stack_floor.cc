// Linked into every daemon (as an object, so the linker keeps it): every
// thread of the process gets at least kMinThreadStack of stack.
//
// glibc carves a thread's static TLS out of its stack. OpenBLAS alone brings
// 60 KiB of it (cuBLAS, if linked, another 94 KiB); civetweb, the HTTP server
// behind /metrics, asks for 100 KiB stacks, so its threads overflowed on the
// first scrape (SIGSEGV) or failed to start (EINVAL: "null context when
// constructing CivetServer"). civetweb offers no option for its stack size,
// so the setter is interposed here: the executable's definition wins over
// libc's for every library that calls it.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {
constexpr size_t kMinThreadStack = size_t{1} << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, std::max(size, kMinThreadStack));
}
