/*
 * atomics.h — the C11 atomics every layer uses, and the one spin-wait hint: kvr_cpu_relax()
 * tells the CPU that the caller busy-waits on memory another core writes (x86 PAUSE, arm64
 * YIELD), so the waiting core yields pipeline resources and leaves the spin loop sooner once
 * the value changes. Elsewhere it is only a compiler barrier.
 */
#ifndef KVR_BASE_ATOMICS_H
#define KVR_BASE_ATOMICS_H

#include <stdatomic.h>

static inline void kvr_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield" ::
                             : "memory");
#else
    __asm__ __volatile__("" ::
                             : "memory");
#endif
}

#endif
