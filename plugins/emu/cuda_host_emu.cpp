// The fiber scheduler behind cuda_host_emu.h (see there for why it exists).
#include "cuda_host_emu.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace trtspec_emu {

dim3 g_thread_idx, g_block_idx, g_block_dim, g_grid_dim;

namespace {

enum State { kReady, kBlockWait, kWarpWait, kDone };

struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    State state = kReady;
};

constexpr size_t kStackBytes = 256 * 1024;

ucontext_t g_scheduler;
std::vector<Fiber>* g_fibers = nullptr;
int g_current = -1;
const std::function<void()>* g_body = nullptr;
std::vector<uint64_t> g_slots;  // one per thread of the block

void fiber_entry() {
    (*g_body)();
    (*g_fibers)[g_current].state = kDone;
    swapcontext(&(*g_fibers)[g_current].ctx, &g_scheduler);
}

void yield_with(State s) {
    Fiber& f = (*g_fibers)[g_current];
    f.state = s;
    swapcontext(&f.ctx, &g_scheduler);
}

[[noreturn]] void deadlock(const char* what) {
    std::fprintf(stderr, "cuda_host_emu: deadlock (%s) in block %u\n", what, g_block_idx.x);
    std::abort();
}

}  // namespace

void run_block(int threads, const std::function<void()>& body) {
    std::vector<Fiber> fibers(static_cast<size_t>(threads));
    g_fibers = &fibers;
    g_body = &body;
    g_slots.assign(static_cast<size_t>(threads), 0);
    for (int t = 0; t < threads; ++t) {
        Fiber& f = fibers[static_cast<size_t>(t)];
        f.stack.reset(new char[kStackBytes]);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.get();
        f.ctx.uc_stack.ss_size = kStackBytes;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_entry, 0);
    }
    const int warps = (threads + 31) / 32;
    while (true) {
        for (int t = 0; t < threads; ++t) {
            if (fibers[static_cast<size_t>(t)].state != kReady) continue;
            g_current = t;
            g_thread_idx.x = static_cast<unsigned int>(t);
            swapcontext(&g_scheduler, &fibers[static_cast<size_t>(t)].ctx);
        }
        // Everyone is waiting or done: release a complete barrier.
        int live = 0, at_block = 0;
        for (const Fiber& f : fibers) {
            live += f.state != kDone;
            at_block += f.state == kBlockWait;
        }
        if (live == 0) break;
        bool released = false;
        if (at_block == live) {
            for (Fiber& f : fibers)
                if (f.state == kBlockWait) f.state = kReady;
            released = true;
        } else {
            for (int w = 0; w < warps; ++w) {
                int wl = 0, ww = 0;
                for (int t = w * 32; t < min(threads, w * 32 + 32); ++t) {
                    wl += fibers[static_cast<size_t>(t)].state != kDone;
                    ww += fibers[static_cast<size_t>(t)].state == kWarpWait;
                }
                if (wl > 0 && ww == wl) {
                    for (int t = w * 32; t < min(threads, w * 32 + 32); ++t)
                        if (fibers[static_cast<size_t>(t)].state == kWarpWait) fibers[static_cast<size_t>(t)].state = kReady;
                    released = true;
                }
            }
        }
        if (!released) deadlock("threads wait at different barriers");
    }
    g_fibers = nullptr;
}

void sync_block() { yield_with(kBlockWait); }

void sync_warp() { yield_with(kWarpWait); }

uint64_t warp_exchange(uint64_t mine, int src) {
    const int t = g_current;
    g_slots[static_cast<size_t>(t)] = mine;
    sync_warp();  // every lane has published
    const uint64_t out = g_slots[static_cast<size_t>((t & ~31) + src)];
    sync_warp();  // every lane has read before anyone publishes again
    return out;
}

unsigned int warp_ballot(bool pred) {
    const int t = g_current;
    g_slots[static_cast<size_t>(t)] = pred ? 1u : 0u;
    sync_warp();
    unsigned int mask = 0;
    const int base = t & ~31;
    for (int l = 0; l < 32 && base + l < static_cast<int>(g_slots.size()); ++l)
        if ((*g_fibers)[static_cast<size_t>(base + l)].state != kDone && g_slots[static_cast<size_t>(base + l)])
            mask |= 1u << l;
    sync_warp();
    return mask;
}

}  // namespace trtspec_emu

// Lets the bindings tell this build from the CUDA one (it takes host pointers).
extern "C" __attribute__((visibility("default"))) int trtspec_kernels_host_emulation(void) { return 1; }
