/* A system-call loop for bench/syscall_tax.py:  syscalls N
 * Makes N getppid() system calls (through syscall(2), so no libc caching) and prints
 * "ns <nanoseconds per call>". Nothing else: what a call costs is the kernel's entry and exit
 * path, plus whatever tracing hooks every system call of every process pays. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("ns %.1f\n", ns / (double)n);
    return 0;
}
