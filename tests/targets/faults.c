/* Target for the fault tests (tests/test_faults_bpf.py), driven by commands on stdin.
 *
 *   faults [--tag=ANY]        prints "ready <pid>", then reads one command per line and prints
 *                             "ok <command>" when it is done:
 *
 *   hold N SIZE      hold_block(): malloc N blocks of SIZE, kept
 *   free             free every held block
 *   leak N SIZE      after_full_leak(): malloc N blocks of SIZE, kept (never freed)
 *   stacks N         deep_leaf() at recursion depths 1..N: N distinct stacks, one 512-byte block each
 *   mmaps N          N anonymous one-page mmap + munmap pairs (accounted in the kernel: no event)
 *   splits N         N x (map 4 pages, unmap its 2nd and 3rd page one at a time, then all 4): two
 *                    rare shapes each, so 2N ring events
 *   threads N        N short-lived threads, 16 at a time, named "sl-<i>": each leaks 48 bytes in
 *                    thread_leak() and maps/unmaps one page, then exits
 *   fork             the child leaks 50 x 4321 in child_alloc() and exits; the parent waits for
 *                    it, then leaks 5 x 1234 in parent_alloc()
 *   exec PATH [ARG]  pre_exec_alloc(): leaks 9 x 2345, then execs PATH (no "ok")
 *   oom              oom_grow(): malloc + touch 1 MiB blocks until the kernel kills us (no "ok")
 *   mmapsig N        map_signature(): one anonymous mapping of N pages, kept
 *   exit             exit(0)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define MAX_HELD (1 << 20)

void *volatile sink;
static void *held[MAX_HELD];
static long nheld;

NOINLINE void hold_block(size_t size)
{
    held[nheld++] = malloc(size);
}

NOINLINE void after_full_leak(size_t size)
{
    sink = malloc(size);
}

NOINLINE void deep_leaf(int depth)
{
    if (depth <= 0) {
        sink = malloc(512);
        return;
    }
    deep_leaf(depth - 1);
    sink = (void *)(size_t)depth; /* not a tail call: one frame per level */
}

NOINLINE void map_pair(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
        munmap(p, 4096);
}

NOINLINE void map_split(void)
{
    char *p = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    munmap(p + 4096, 4096);     /* not at a region's start: handed to the tracer */
    munmap(p + 2 * 4096, 4096); /* likewise */
    munmap(p, 4 * 4096);
}

NOINLINE void map_signature(long pages)
{
    sink = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

NOINLINE void thread_leak(void)
{
    sink = malloc(48);
}

static void *short_main(void *arg)
{
    char name[16];
    snprintf(name, sizeof name, "sl-%ld", (long)(size_t)arg);
    pthread_setname_np(pthread_self(), name);
    thread_leak();
    map_pair();
    return NULL;
}

NOINLINE void child_alloc(void)
{
    for (int i = 0; i < 50; i++)
        sink = malloc(4321);
}

NOINLINE void parent_alloc(void)
{
    for (int i = 0; i < 5; i++)
        sink = malloc(1234);
}

NOINLINE void pre_exec_alloc(void)
{
    for (int i = 0; i < 9; i++)
        sink = malloc(2345);
}

NOINLINE void oom_grow(void)
{
    for (;;) {
        char *p = malloc(1 << 20);
        if (p)
            memset(p, 0x5a, 1 << 20);
        sink = p;
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    char line[4096];
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char cmd[32] = "", a1[4000] = "";
        long n = 0, size = 0;
        sscanf(line, "%31s %3999s", cmd, a1);
        sscanf(line, "%*s %ld %ld", &n, &size);
        if (!strcmp(cmd, "hold")) {
            for (long i = 0; i < n && nheld < MAX_HELD; i++)
                hold_block(size);
        } else if (!strcmp(cmd, "free")) {
            while (nheld)
                free(held[--nheld]);
        } else if (!strcmp(cmd, "leak")) {
            for (long i = 0; i < n; i++)
                after_full_leak(size);
        } else if (!strcmp(cmd, "stacks")) {
            for (long i = 1; i <= n; i++)
                deep_leaf((int)i);
        } else if (!strcmp(cmd, "mmaps")) {
            for (long i = 0; i < n; i++)
                map_pair();
        } else if (!strcmp(cmd, "splits")) {
            for (long i = 0; i < n; i++)
                map_split();
        } else if (!strcmp(cmd, "mmapsig")) {
            map_signature(n);
        } else if (!strcmp(cmd, "threads")) {
            for (long i = 0; i < n; i += 16) {
                pthread_t t[16];
                int k = 0;
                for (; k < 16 && i + k < n; k++)
                    pthread_create(&t[k], NULL, short_main, (void *)(size_t)(i + k));
                for (int j = 0; j < k; j++)
                    pthread_join(t[j], NULL);
            }
        } else if (!strcmp(cmd, "fork")) {
            pid_t c = fork();
            if (c == 0) {
                child_alloc();
                _exit(0);
            }
            waitpid(c, NULL, 0);
            parent_alloc();
        } else if (!strcmp(cmd, "exec")) {
            pre_exec_alloc();
            char *rest = line + strlen(cmd);
            while (*rest == ' ')
                rest++;
            char *args[8] = {0};
            int k = 0;
            for (char *tok = strtok(rest, " "); tok && k < 7; tok = strtok(NULL, " "))
                args[k++] = tok;
            fflush(stdout);
            execv(args[0], args);
            perror("execv");
            return 127;
        } else if (!strcmp(cmd, "oom")) {
            oom_grow();
        } else if (!strcmp(cmd, "exit")) {
            return 0;
        } else {
            printf("unknown %s\n", cmd);
            fflush(stdout);
            continue;
        }
        printf("ok %s\n", cmd);
        fflush(stdout);
    }
    return 0;
}
