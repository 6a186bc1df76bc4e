/*
 * Memory copies counted by call site: an LD_PRELOAD library that stands in
 * for glibc's memcpy and memmove, notes each call's return address and
 * length, and passes it on. Rust's moves of large values (futures,
 * requests, results) and its slice copies are such calls. At exit it
 * writes one line per call site: offset in its object, calls, bytes, the
 * object's path (to COUNT_COPIES_OUT). Counting starts at once; sites are
 * resolved to functions and lines by comparison/copies.py.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SITES 65536

static uintptr_t site[SITES];
static unsigned long calls[SITES], bytes[SITES];
static void *(*next_memcpy)(void *, const void *, size_t);
static void *(*next_memmove)(void *, const void *, size_t);

/* Before dlsym has answered (it may copy while it resolves): by hand. */
static void *by_hand(void *to, const void *from, size_t n) {
    unsigned char *t = to;
    const unsigned char *f = from;
    if (t < f) {
        for (size_t i = 0; i < n; i++) t[i] = f[i];
    } else {
        for (size_t i = n; i > 0; i--) t[i - 1] = f[i - 1];
    }
    return to;
}

static void note(uintptr_t at, size_t n) {
    size_t h = (at * 0x9E3779B97F4A7C15ull) >> 48;
    for (size_t probes = 0; probes < SITES; probes++, h = (h + 1) & (SITES - 1)) {
        if (site[h] == at || site[h] == 0) {
            site[h] = at;
            calls[h]++;
            bytes[h] += n;
            return;
        }
    }
}

void *memcpy(void *to, const void *from, size_t n) {
    if (!next_memcpy && !(next_memcpy = dlsym(RTLD_NEXT, "memcpy"))) return by_hand(to, from, n);
    note((uintptr_t)__builtin_return_address(0), n);
    return next_memcpy(to, from, n);
}

void *memmove(void *to, const void *from, size_t n) {
    if (!next_memmove && !(next_memmove = dlsym(RTLD_NEXT, "memmove"))) return by_hand(to, from, n);
    note((uintptr_t)__builtin_return_address(0), n);
    return next_memmove(to, from, n);
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("COUNT_COPIES_OUT");
    FILE *out = fopen(path ? path : "copies.txt", "w");
    if (!out) return;
    for (size_t i = 0; i < SITES; i++) {
        if (!site[i]) continue;
        Dl_info info;
        if (!dladdr((void *)site[i], &info) || !info.dli_fname) continue;
        fprintf(out, "%lx %lu %lu %s\n", (unsigned long)(site[i] - (uintptr_t)info.dli_fbase),
                calls[i], bytes[i], info.dli_fname);
    }
    fclose(out);
}
