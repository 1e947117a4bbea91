/* Lazy unwind tables test target (tests/test_unwind_bpf.py), built -O2 -fomit-frame-pointer.
 *   lazy LIB N1 N2
 * LIB is a large generated library (thousands of functions) whose big_entry(round, size) calls
 * down a chain of its own functions to malloc(size). At start the program dlopens LIB and warms
 * its heap (nothing below allocates from a fresh break), prints "ready" and waits for a line;
 * then round 1: N1 mallocs of 4321 bytes through LIB, "phase1", a line; round 2: N2 mallocs of
 * 1234 bytes the same way, "done"; then it lingers until stdin closes. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define NI __attribute__((noinline, noipa))

void *volatile sink;

NI void rounds(void (*entry)(int, size_t), int n, size_t size)
{
    for (int i = 0; i < n; i++)
        entry(i, size); /* Z1 */
    sink = 0;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 1;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    void (*entry)(int, size_t) = (void (*)(int, size_t))dlsym(h, "big_entry");
    free(malloc(100000)); /* the heap is set up before the probes come */
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    rounds(entry, atoi(argv[2]), 4321); /* Z0 */
    printf("phase1\n");
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    rounds(entry, atoi(argv[3]), 1234); /* Z2 */
    printf("done\n");
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin))
        ;
    return 0;
}
