/*
 * core/ckf.h — the Cuckoo filter moved to wire/ckf.h (its layout is part of the published
 * format, and wire/ codecs use it). This header only forwards, for core/publisher.c, which
 * still includes it by its old name; once it says wire/ckf.h, this header goes.
 */
#ifndef KVR_CORE_CKF_H
#define KVR_CORE_CKF_H
#include "wire/ckf.h"
#endif
