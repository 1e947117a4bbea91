/* Shared library for the dlopen unwinding test, built -O2 -fomit-frame-pointer -shared -fPIC
 * (tests/test_unwind_bpf.py). dl_entry allocates 4 noinline calls deep inside the library. */
#include <stdlib.h>

#define NI __attribute__((noinline, noipa))

void *volatile dl_sink;

NI void *dl_level4(size_t n) { void *p = malloc(n); /* DL4 */ dl_sink = p; return p; }
NI void *dl_level3(size_t n) { void *p = dl_level4(n); /* DL3 */ dl_sink = p; return p; }
NI void *dl_level2(size_t n) { void *p = dl_level3(n); /* DL2 */ dl_sink = p; return p; }
NI void *dl_level1(size_t n) { void *p = dl_level2(n); /* DL1 */ dl_sink = p; return p; }

void *dl_entry(size_t n)
{
    void *p = dl_level1(n); /* DL0 */
    dl_sink = p;
    return p;
}
