/*
 * core/log.h — logging moved to base/log.h (the bottom layer, so that shm/ may log). This
 * header only forwards, for the files that still include it by its old name: src/core/store.c,
 * src/io (api.c, h1.c, http.c, uring.c) and tests/fuzz/fuzz_h1.c. New code includes
 * base/log.h; once those files say so, this header goes.
 */
#ifndef KVR_CORE_LOG_H
#define KVR_CORE_LOG_H
#include "base/log.h"
#endif
