// sanitizer_options.cpp: the CLI's built-in sanitizer options, in AddressSanitizer builds
// only (STASH_SANITIZE=address,...); an empty file otherwise.
//
// Note [LSan and dynamic TLS]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Up to LLVM 16 and GCC 13, the sanitizer runtime's __tls_get_addr interceptor takes a
// dynamic TLS block for one with a pre-2.25 glibc header whenever the block happens to
// start 16 bytes past a page boundary, and reads the two words before it as the block's
// range. No glibc since 2.25 has that header, so the guess depends on where malloc put the
// block: rarely, and then every time for a given binary and heap layout, LeakSanitizer's
// tracer faults at exit ("Tracer caught signal 11") before it reports anything. `stash
// demo` (which loads libcupti, a library with dynamic TLS) met it on Debian 12's clang 14.
// intercept_tls_get_addr=0 turns that interceptor off; leak checking stays on, and an
// ASAN_OPTIONS a caller sets still applies on top of this default.
#if defined(__SANITIZE_ADDRESS__)
#define STASH_CLI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STASH_CLI_ASAN 1
#endif
#endif

#ifdef STASH_CLI_ASAN
extern "C" __attribute__((visibility("default"), used)) const char* __asan_default_options() {
  return "intercept_tls_get_addr=0";
}
#endif
