/* bench/marker_trap.py's loop: calls a copy of the --inject agent's marker code (agent.c "Markers":
 * nopl 0(%rax,%rax,1); push %rbp; pop %rbp; ret) argv[1] times; prints ns per call. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__asm__(".text\n.globl marker\n.type marker,@function\n.p2align 4\nmarker:\n"
        ".byte 0x0f,0x1f,0x44,0x00,0x00\npush %rbp\npop %rbp\nret\n.size marker,.-marker\n");
void marker(long i);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    struct timespec a, b;
    marker(0); /* the first hit is where the kernel rewrites an optimizable probe */
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        marker(i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
