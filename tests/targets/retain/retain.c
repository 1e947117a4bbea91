/* Retention after a burst of large frees, under whichever allocator is preloaded (glibc when
 * none): N blocks of SIZE bytes are allocated and touched page by page, all but every 8th freed
 * (the last one kept, so glibc's heap top stays), then the allocator's own statistics are printed
 * as the ground truth; on a second SIGUSR1 its purge call runs and the figures are printed again.
 *
 *   retain [--blocks N] [--mib M]   prints "ready <pid> <allocator>", waits for SIGUSR1, works in
 *                                   thread "burster", prints "truth ..." and "freed"; waits for
 *                                   SIGUSR1, purges in thread "purger", prints "truth ..." and
 *                                   "purged"; then lingers until stdin closes.
 * truth lines: "truth <allocator> live=<bytes> retained=<bytes> resident=<bytes> rss=<bytes>"
 *   jemalloc: mallctl("epoch"), then stats.allocated (live), stats.resident - stats.allocated
 *   tcmalloc: generic.current_allocated_bytes (live); generic.heap_size - pageheap_unmapped_bytes
 *             - current_allocated (retained: the page heap's free bytes plus the caches');
 *             tcmalloc.pageheap_free_bytes printed beside
 *   mimalloc: mi_usable_size of the kept blocks (live); mi_process_info's peak_rss, less the
 *             RSS before the burst (/proc/self/statm), less live (retained; mimalloc 2.0 gives no resident figure:
 *             its current_rss is its commit estimate, which counts committed pages never touched
 *             — 436 MB for 394 MB resident here; the peak is the resident memory while nothing
 *             was released, so it holds after the frees, not after a purge)
 *   glibc:    mallinfo2: uordblks + hblkhd (live), fordblks (retained)
 * The purge: mallctl("arena.4096.purge"), MallocExtension_ReleaseFreeMemory(), mi_collect(true),
 * malloc_trim(0).
 *   --warm: before "ready", the same burst once in thread "warmer", which frees all but one
 *   block in 32 (mimalloc: then waits for its delayed decommit of the free pages; the segments
 *   stay, holding the kept blocks) and ends: the allocator's memory is mapped before a tracer attaches,
 *   and the burst after reuses it (mimalloc: reclaims the abandoned segments). mimalloc's
 *   resident for the truth is then the RSS now less the RSS at "ready": what the burst made
 *   appear (its peak would be the warm-up's).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static int nblocks = 24;
static size_t size = 16u << 20;
static void *blocks[4096];
static const char *alloc_name = "glibc";

typedef int (*mallctl_t)(const char *, void *, size_t *, void *, size_t);
typedef int (*tc_prop_t)(const char *, size_t *);
typedef void (*tc_release_t)(void);
typedef void (*mi_info_t)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *);
typedef void (*mi_collect_t)(bool);
typedef size_t (*mi_usable_t)(const void *);

static mallctl_t je_ctl;
static tc_prop_t tc_prop;
static tc_release_t tc_release;
static mi_info_t mi_info;
static mi_collect_t mi_coll;
static mi_usable_t mi_usable;
static size_t mi_base_rss; /* RSS before the burst */
static bool warm_base;     /* --warm: the burst's resident is the RSS now less mi_base_rss */

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (size_t)sysconf(_SC_PAGESIZE);
}

static size_t tc(const char *name)
{
    size_t v = 0;
    tc_prop(name, &v);
    return v;
}

static void truth(void)
{
    size_t live = 0, retained = 0, resident = 0;
    if (je_ctl) {
        uint64_t epoch = 1;
        size_t sz = sizeof(epoch), allocated = 0;
        je_ctl("epoch", &epoch, &sz, &epoch, sz);
        sz = sizeof(size_t);
        je_ctl("stats.allocated", &allocated, &sz, NULL, 0);
        sz = sizeof(size_t);
        je_ctl("stats.resident", &resident, &sz, NULL, 0);
        long decay_ms = 0; /* a setting read whose name has "decay" in it: no purge either */
        sz = sizeof(decay_ms);
        je_ctl("opt.dirty_decay_ms", &decay_ms, &sz, NULL, 0);
        live = allocated;
        retained = resident - allocated;
    } else if (tc_prop) {
        live = tc("generic.current_allocated_bytes");
        resident = tc("generic.heap_size") - tc("tcmalloc.pageheap_unmapped_bytes");
        retained = resident - live;
        printf("tcmalloc pageheap_free=%zu\n", tc("tcmalloc.pageheap_free_bytes"));
    } else if (mi_info) {
        size_t e, u, s, rss, peak, commit = 0, pc, faults;
        for (int i = 0; i < nblocks; i++)
            if (blocks[i])
                live += mi_usable(blocks[i]);
        mi_info(&e, &u, &s, &rss, &peak, &commit, &pc, &faults);
        (void)rss; /* mimalloc 2.0's current_rss is its commit estimate, not resident memory */
        resident = (warm_base ? rss_bytes() : peak) - mi_base_rss;
        retained = resident > live ? resident - live : 0;
    } else {
        struct mallinfo2 mi = mallinfo2();
        live = mi.uordblks + mi.hblkhd;
        retained = mi.fordblks;
        resident = live + retained;
    }
    printf("truth %s live=%zu retained=%zu resident=%zu rss=%zu\n", alloc_name, live, retained, resident,
           rss_bytes());
    fflush(stdout);
}

static void *burst(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "burster");
    for (int i = 0; i < nblocks; i++) {
        blocks[i] = malloc(size);
        memset(blocks[i], 1, size); /* every page resident */
    }
    for (int i = 0; i < nblocks; i++)
        if (i % 8 != 7) {
            free(blocks[i]);
            blocks[i] = NULL;
        }
    truth();
    return NULL;
}

static void *purge(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "purger");
    if (je_ctl)
        je_ctl("arena.4096.purge", NULL, NULL, NULL, 0); /* MALLCTL_ARENAS_ALL */
    else if (tc_release)
        tc_release();
    else if (mi_coll)
        mi_coll(true);
    else
        malloc_trim(0);
    truth();
    return NULL;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stage; /* threads stay alive until the end: a thread's exit flushes its caches */

static void *hold(void *(*fn)(void *))
{
    fn(NULL);
    pthread_mutex_lock(&mu);
    stage++;
    pthread_cond_broadcast(&cv);
    while (stage < 100)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void *warmed[4096]; /* the warm-up's blocks kept: one in 32, live before the attach */

static void *warm(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "warmer");
    for (int i = 0; i < nblocks; i++) {
        warmed[i] = malloc(size);
        memset(warmed[i], 1, size);
    }
    for (int i = 0; i < nblocks; i++)
        if (i % 32 != 31) {
            free(warmed[i]);
            warmed[i] = NULL;
        }
    for (int k = 0; k < 3 && mi_coll; k++) {
        usleep(300 * 1000); /* past mimalloc 2.0's segment_decommit_delay (500 ms): its next */
        free(malloc(64));   /* call decommits the free slices; the segments stay, each */
        mi_coll(false);     /* holding a kept block */
    }
    return NULL; /* the thread ends: its segments are abandoned, for the burster to reclaim */
}

static void *hold_burst(void *a) { (void)a; return hold(burst); }

static void *hold_purge(void *a) { (void)a; return hold(purge); }

static void run(void *(*fn)(void *), int upto)
{
    pthread_t t;
    pthread_create(&t, NULL, fn, NULL);
    pthread_detach(t);
    pthread_mutex_lock(&mu);
    while (stage < upto)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

int main(int argc, char **argv)
{
    bool warmup = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--warm"))
            warmup = true;
        else if (i + 1 == argc)
            break;
        else if (!strcmp(argv[i], "--blocks"))
            nblocks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib"))
            size = (size_t)atoi(argv[++i]) << 20;
    }
    if (nblocks > 4096)
        nblocks = 4096;
    je_ctl = (mallctl_t)dlsym(RTLD_DEFAULT, "mallctl");
    tc_prop = (tc_prop_t)dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");
    tc_release = (tc_release_t)dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory");
    mi_info = (mi_info_t)dlsym(RTLD_DEFAULT, "mi_process_info");
    mi_coll = (mi_collect_t)dlsym(RTLD_DEFAULT, "mi_collect");
    mi_usable = (mi_usable_t)dlsym(RTLD_DEFAULT, "mi_usable_size");
    if (mi_info) {
        /* the process's RSS before the burst: its peak_rss (getrusage) is no base, since
         * ru_maxrss survives exec and starts at the parent's (pytest's ~186 MB) */
        mi_base_rss = rss_bytes();
    }
    alloc_name = je_ctl ? "jemalloc" : tc_prop ? "tcmalloc" : mi_info ? "mimalloc" : "glibc";
    if (!je_ctl && !tc_prop && !mi_info)
        mallopt(M_MMAP_THRESHOLD, 64 << 20); /* glibc: the blocks in the main heap, not mmapped chunks */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    if (warmup) {
        pthread_t w;
        pthread_create(&w, NULL, warm, NULL);
        pthread_join(w, NULL);
        warm_base = true;
        mi_base_rss = rss_bytes(); /* what appears from now on: the burst's */
    }
    printf("ready %d %s\n", (int)getpid(), alloc_name);
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
    run(hold_burst, 1);
    printf("freed\n");
    fflush(stdout);
    sigwait(&set, &sig);
    run(hold_purge, 2);
    printf("purged\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    return 0;
}
