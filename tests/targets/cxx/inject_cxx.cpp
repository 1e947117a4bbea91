// C++ target for --inject (tests/test_inject_bpf.py): operator new/delete and std containers
// over glibc malloc, under load. Prints "ready <pid>". Threads "cxx-churn-<i>" build and drop
// strings and vectors in a loop. SIGUSR1: thread "cxx-keeper" keeps 3000 `Item`s (5000 bytes
// each) made in keep_items() and prints "held"; SIGTERM: everything is checked and freed,
// "bye <ops>", exit 0 (3 when an item was corrupted).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define NI __attribute__((noinline))

struct Item {
    unsigned char bytes[5000];
};

static std::atomic<bool> stop{false};
static std::atomic<unsigned long> ops{0};
static std::vector<Item *> items;

NI void keep_items()
{
    items.reserve(3000);
    for (int i = 0; i < 3000; i++) {
        Item *it = new Item;
        memset(it->bytes, i & 0xff, sizeof it->bytes);
        items.push_back(it);
    }
}

NI unsigned churn_once(unsigned i)
{
    std::string s(16 + i % 200, 'x');
    std::vector<long> v;
    for (unsigned k = 0; k < 8 + i % 32; k++)
        v.push_back(k);
    return (unsigned)s.size() + (unsigned)v.size();
}

static void churn(int id)
{
    char name[16];
    snprintf(name, sizeof name, "cxx-churn-%d", id);
    pthread_setname_np(pthread_self(), name);
    unsigned sum = 0;
    for (unsigned i = 0; !stop; i++) {
        sum += churn_once(i);
        ops++;
    }
    if (sum == 1)
        puts("");
}

int main()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::vector<std::thread> th;
    for (int i = 0; i < 2; i++)
        th.emplace_back(churn, i);
    std::thread keeper;
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (;;) {
        int sig = 0;
        sigwait(&set, &sig);
        if (sig == SIGUSR1 && !keeper.joinable()) {
            keeper = std::thread([] {
                pthread_setname_np(pthread_self(), "cxx-keeper");
                keep_items();
                printf("held\n");
                fflush(stdout);
            });
        } else if (sig != SIGUSR1) {
            break;
        }
    }
    stop = true;
    for (auto &t : th)
        t.join();
    if (keeper.joinable())
        keeper.join();
    int bad = 0;
    for (size_t i = 0; i < items.size(); i++) {
        if (items[i]->bytes[0] != (i & 0xff) || items[i]->bytes[4999] != (i & 0xff))
            bad = 1;
        delete items[i];
    }
    printf("bye %lu\n", ops.load());
    return bad ? 3 : 0;
}
