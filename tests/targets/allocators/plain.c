/* libplain.so for tests/targets/allocators/rjem.c: a C library that allocates with glibc's
 * malloc, as the C and C++ libraries of a Rust daemon do beside its own jemalloc. */
#include <stdlib.h>

void *plain_alloc(size_t n)
{
    return malloc(n);
}

void plain_free(void *p)
{
    free(p);
}
