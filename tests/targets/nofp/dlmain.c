/* dlopen test target (tests/test_unwind_bpf.py), built -O2 -fomit-frame-pointer.
 *   dlmain [--wait-stdin] [--exit] [--settle MS] LIB
 * After the go line (--wait-stdin), the main thread dlopens LIB and calls its dl_entry(2468)
 * right away, or after MS milliseconds with --settle; prints "done", then lingers until stdin
 * closes unless --exit. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NI __attribute__((noinline, noipa))

void *volatile sink;

NI void *call_lib(void *(*entry)(size_t)) { void *p = entry(2468); /* E1 */ sink = p; return p; }

int main(int argc, char **argv)
{
    int wait = 0, leave = 0, settle = 0;
    const char *lib = "";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait-stdin"))
            wait = 1;
        else if (!strcmp(argv[i], "--exit"))
            leave = 1;
        else if (!strcmp(argv[i], "--settle") && i + 1 < argc)
            settle = atoi(argv[++i]);
        else
            lib = argv[i];
    }
    char line[64];
    if (wait) {
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
            return 1;
    }
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    void *(*entry)(size_t) = (void *(*)(size_t))dlsym(h, "dl_entry");
    if (settle) {
        struct timespec ts = {settle / 1000, (settle % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    call_lib(entry); /* E0 */
    printf("done\n");
    fflush(stdout);
    if (!leave)
        while (fgets(line, sizeof(line), stdin))
            ;
    return 0;
}
