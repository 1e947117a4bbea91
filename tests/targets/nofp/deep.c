/* Test target for DWARF unwinding: built -O2 -fomit-frame-pointer (tests/test_unwind_bpf.py).
 *
 * After a line on stdin (or at once without --wait-stdin), thread "deep" makes allocations
 * 10 noinline calls deep through the malloc family, an anonymous mmap the same way, and one
 * malloc inside a SIGUSR2 handler (a signal frame on the stack); then prints "done" and
 * lingers until stdin closes. Every call line is marked "L<n>" for the test's file:line check.
 *
 *   deep [--wait-stdin] [--exit] [--recurse N]
 *     --exit        return after the work instead of lingering
 *     --recurse N   also malloc(777) N frames deeper (beyond the unwinder's 64 frames: truncated)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NI __attribute__((noinline, noipa))

void *volatile sink;

NI void *level10(size_t n)
{
    void *p = malloc(n); /* L10 */
    sink = p;
    return p;
}
NI void *level9(size_t n) { void *p = level10(n); /* L9 */ sink = p; return p; }
NI void *level8(size_t n) { void *p = level9(n); /* L8 */ sink = p; return p; }
NI void *level7(size_t n) { void *p = level8(n); /* L7 */ sink = p; return p; }
NI void *level6(size_t n) { void *p = level7(n); /* L6 */ sink = p; return p; }
NI void *level5(size_t n) { void *p = level6(n); /* L5 */ sink = p; return p; }
NI void *level4(size_t n) { void *p = level5(n); /* L4 */ sink = p; return p; }
NI void *level3(size_t n) { void *p = level4(n); /* L3 */ sink = p; return p; }
NI void *level2(size_t n) { void *p = level3(n); /* L2 */ sink = p; return p; }
NI void *level1(size_t n) { void *p = level2(n); /* L1 */ sink = p; return p; }

NI void *map_level3(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* M3 */
    sink = p;
    return p;
}
NI void *map_level2(size_t n) { void *p = map_level3(n); /* M2 */ sink = p; return p; }
NI void *map_level1(size_t n) { void *p = map_level2(n); /* M1 */ sink = p; return p; }

NI void *calloc_level2(size_t n) { void *p = calloc(n, 3); /* C2 */ sink = p; return p; }
NI void *calloc_level1(size_t n) { void *p = calloc_level2(n); /* C1 */ sink = p; return p; }

static int recurse_depth;

NI long recurse(int d)
{
    long r = d > 0 ? recurse(d - 1) : (long)(sink = malloc(777)); /* D0 */
    sink = &r; /* not a tail call */
    return r + 1;
}

static void on_usr2(int sig)
{
    (void)sig;
    void *p = malloc(5555); /* S0 */
    sink = p;
}
NI void signal_level2(void) { raise(SIGUSR2); /* S2 */ sink = 0; }
NI void signal_level1(void) { signal_level2(); /* S1 */ sink = 0; }

static void *deep_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "deep");
    for (int i = 0; i < 3; i++)
        level1(4321); /* T0 */
    map_level1(7 * 4096); /* T1 */
    calloc_level1(1001); /* T2 */
    signal_level1(); /* T3 */
    if (recurse_depth)
        recurse(recurse_depth);
    return NULL;
}

int main(int argc, char **argv)
{
    int wait = 0, leave = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait-stdin"))
            wait = 1;
        else if (!strcmp(argv[i], "--exit"))
            leave = 1;
        else if (!strcmp(argv[i], "--recurse") && i + 1 < argc)
            recurse_depth = atoi(argv[++i]);
    }
    signal(SIGUSR2, on_usr2);
    char line[64];
    if (wait) {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
            return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, deep_main, NULL);
    pthread_join(t, NULL);
    printf("done\n");
    fflush(stdout);
    if (!leave)
        while (fgets(line, sizeof(line), stdin))
            ;
    return 0;
}
