// Test target for DWARF unwinding of C++ release code (tests/test_unwind_bpf.py).
// Built `g++ -O2 -g` (no frame pointers). After a line on stdin, thread "cxx-worker" allocates
// with new and std::vector through cxx_outer -> Maker::middle -> cxx_inner (never inlined);
// then "done", and the program lingers until stdin closes.
#include <pthread.h>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#define NI __attribute__((noinline))

static std::vector<std::vector<int> *> kept;
static std::vector<int> grown;

namespace shop {
struct Widget {
    long a[37];
};

NI std::vector<int> *cxx_inner(int n)
{
    auto *v = new std::vector<int>(n, 7); // X3
    kept.push_back(v);
    for (int i = 0; i < n; i++)
        grown.push_back(i); // X4
    return v;
}

struct Maker {
    NI Widget *middle(int n);
};

NI Widget *Maker::middle(int n)
{
    cxx_inner(n); // X2
    Widget *w = new Widget(); // X5
    asm volatile("" ::: "memory");
    return w;
}
} // namespace shop

NI void cxx_outer(int n)
{
    shop::Maker m;
    for (int i = 0; i < 4; i++) {
        shop::Widget *w = m.middle(n + i); // X1
        asm volatile("" : : "r"(w) : "memory");
    }
}

static void *worker(void *)
{
    pthread_setname_np(pthread_self(), "cxx-worker");
    cxx_outer(300); // X0
    return nullptr;
}

int main()
{
    std::string line;
    std::printf("ready\n");
    std::fflush(stdout);
    if (!std::getline(std::cin, line))
        return 1;
    pthread_t t;
    pthread_create(&t, nullptr, worker, nullptr);
    pthread_join(t, nullptr);
    std::printf("done\n");
    std::fflush(stdout);
    while (std::getline(std::cin, line))
        ;
    return 0;
}
