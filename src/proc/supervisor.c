/*
 * supervisor.c — kvrelay-supervisor: maps the segment, binds the listeners, forks the
 * workers, and keeps them running. It never serves traffic.
 *
 * Signals are never handled asynchronously: they stay blocked and the main loop takes them
 * with sigtimedwait, so all work (reaping, repairing the store, respawning) happens in
 * plain code. Children sit in a table with their slot, pid and respawn state.
 *
 *  - A child that dies is reaped (waitpid), its process slot repaired in the store
 *    (kvr_store_reap_slot: its locks, pins and half-written blocks), and it is replaced.
 *    Killed by a signal from outside (SIGKILL, SIGTERM, ...) or by the watchdog: at once.
 *    Crashed (another signal, or an exit) within 5 s of its start: at once the first time,
 *    then after a back-off doubling from 100 ms to 10 s, while the others serve; when no
 *    worker would be left running, the back-off of the first to restart is cut to 100 ms
 *    (a crash loop then costs one fork per 100 ms, never the whole service).
 *  - Watchdog: every worker and the publisher advance a heartbeat in their process slot
 *    each loop iteration. One whose heartbeat has not moved for half of --hang-timeout
 *    leaves readiness at once, and its slot's bit in the segment's ctl.late makes /readyz
 *    answer 503 on every worker until it moves again; at the full timeout it is logged,
 *    SIGKILLed, and then reaped, repaired and replaced like any other death. The bit stays
 *    until the replacement serves, which is logged too.
 *  - SIGTERM/SIGINT: mark draining (readiness fails), close our copies of the listeners,
 *    SIGTERM every child; each drains within --shutdown-grace. Stragglers get SIGKILL a
 *    second after the grace. Exit 0.
 *
 * The workers share one HTTP listening socket, which the supervisor keeps open, so a dead
 * worker's replacement loses no queued connection; they take turns at it by the connections
 * each holds (io/h1.c, docs/concurrency.md "Accept turns"). Each worker owns one gRPC
 * listener of a SO_REUSEPORT group; the supervisor keeps a dead worker's for its replacement.
 */
#include "proc/supervisor.h"

#include "base/barrier.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/proctitle.h"
#include "io/ssdfile.h"
#include "proc/publisher.h"
#include "core/relay_int.h"
#include "core/store.h"
#include "core/tenants_file.h"
#include "core/tenants_table.h"
#include "proc/worker.h"
#include "io/listen.h"
#include "io/uring.h"
#include "wire/keys.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHILDREN   (KVR_MAX_PROCS - 2)
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000
#define YOUNG_MS       5000

enum { CH_EMPTY,
       CH_RUNNING,
       CH_WAITING }; /* WAITING: dead, respawn at respawn_at */

typedef struct {
    int state;
    int role;
    int index; /* worker number */
    int slot;  /* process slot in the segment */
    pid_t pid;
    int grpc_fd;
    uint64_t started_ms;
    uint64_t respawn_at;
    uint64_t died_ms;
    unsigned young_deaths;
    uint64_t hb_seen;  /* heartbeat value last sampled ... */
    uint64_t hb_at_ms; /* ... and when it last moved */
    int suspect;       /* heartbeat late: taken out of readiness, not yet killed */
    int hung;          /* the watchdog killed it */
    int serving;       /* the watchdog has seen its ready flag set */
    pid_t prev_pid;    /* the process it replaces (0: the first start) ... */
    int prev_hung;     /* ... and whether that one was killed as hung */
} child_t;

typedef struct {
    const kvr_config_t *cfg;
    kvr_seg_t seg;
    kvr_store_t store;
    kvr_relay_t relay;
    kvr_relay_fds_t fds;
    kvr_tenants_src_t tenants; /* --tenants, --token, --admin-token: published into the segment */
    child_t ch[MAX_CHILDREN];
    int nch;
    int http_fd; /* the workers' one HTTP listener */
    int draining;
    uint64_t drain_deadline;
    sigset_t sigs, oldmask;
} sup_t;

static int spawn(sup_t *s, child_t *c)
{
    pid_t pid = fork();

    if (pid < 0) {
        kvr_error("fork: %s", strerror(errno));
        return KVR_ERR;
    }
    if (pid == 0) {
        /* Close the other children's gRPC listeners (only ours may accept here), and the
         * HTTP one in the publisher. */
        for (int i = 0; i < s->nch; i++)
            if (&s->ch[i] != c && s->ch[i].grpc_fd >= 0)
                close(s->ch[i].grpc_fd);
        if (c->role == KVR_ROLE_PUBLISHER)
            close(s->http_fd);
        sigprocmask(SIG_SETMASK, &s->oldmask, NULL);
        if (c->role == KVR_ROLE_PUBLISHER)
            kvr_proctitle_set("kvrelay: publisher");
        else
            kvr_proctitle_set("kvrelay: worker %d", c->index);
        if (c->role == KVR_ROLE_PUBLISHER)
            kvr_publisher_main(s->cfg, &s->seg, c->slot, &s->fds);
        kvr_worker_main(s->cfg, &s->seg, c->index, c->slot, s->http_fd, c->grpc_fd, &s->fds);
    }
    c->pid = pid;
    c->state = CH_RUNNING;
    c->started_ms = kvr_clock_ms();
    c->hung = 0;
    c->suspect = 0;
    c->serving = 0;
    c->hb_seen = kvr_atomic_load_relaxed(&s->seg.procs[c->slot].heartbeat); /* a count: compared only */
    c->hb_at_ms = c->started_ms;
    if (c->role == KVR_ROLE_PUBLISHER)
        kvr_info("publisher started (pid %d, slot %d)", (int)pid, c->slot);
    else
        kvr_info("worker %d started (pid %d, slot %d)", c->index, (int)pid, c->slot);
    return KVR_OK;
}

static child_t *find_child(sup_t *s, pid_t pid)
{
    for (int i = 0; i < s->nch; i++)
        if (s->ch[i].state == CH_RUNNING && s->ch[i].pid == pid)
            return &s->ch[i];
    return NULL;
}

/* Takes a child out of readiness (once: guarded by its slot's ready flag). 1 if it was in. */
static int take_readiness(sup_t *s, child_t *c)
{
    /* seq_cst RMW against the child's own store of ready = 1 (worker.c, publisher.c): the
     * running count it added is taken back exactly once per ready flag it raised. */
    if (!kvr_atomic_exchange_seq_cst(&s->seg.procs[c->slot].ready, 0))
        return 0;
    if (c->role == KVR_ROLE_PUBLISHER) {
        /* seq_cst as the publisher's store of 1 (publisher.c), which it orders against; then
         * the revision, after it (the catalog rule of docs/concurrency.md: emit_catalog loads
         * the revision first, publisher_running after) */
        kvr_atomic_store_seq_cst(&s->seg.hdr->ctl.publisher_running, 0);
        kvr_atomic_fetch_add_seq_cst(&s->relay.sh->catalog_revision, 1); /* the pool leaves the catalog */
    } else
        /* seq_cst RMW against the worker's own fetch_add at its start (worker.c) */
        kvr_atomic_fetch_sub_seq_cst(&s->seg.hdr->ctl.workers_running, 1);
    return 1;
}

/* Undoes take_readiness for a suspect whose heartbeat moved again (only this thread writes
 * ready = 0 after start-up, so nothing races us but the child's death, which reaping sees). */
static void give_readiness(sup_t *s, child_t *c)
{
    /* seq_cst, as the exchange it undoes (take_readiness) */
    kvr_atomic_store_seq_cst(&s->seg.procs[c->slot].ready, 1);
    if (c->role == KVR_ROLE_PUBLISHER) {
        /* the same order as take_readiness: publisher_running, then the revision */
        kvr_atomic_store_seq_cst(&s->seg.hdr->ctl.publisher_running, 1);
        kvr_atomic_fetch_add_seq_cst(&s->relay.sh->catalog_revision, 1); /* and is back in it */
    } else
        kvr_atomic_fetch_add_seq_cst(&s->seg.hdr->ctl.workers_running, 1); /* as take_readiness */
}

static const char *role_name(const child_t *c)
{
    return c->role == KVR_ROLE_PUBLISHER ? "publisher" : "worker";
}

/* The child's slot in ctl.late: set when its heartbeat misses the deadline, cleared when it
 * moves again or the slot's replacement serves. This thread is the only writer. */
static void mark_late(sup_t *s, const child_t *c, int late)
{
    uint64_t bit = 1ull << c->slot;

    /* RMWs, so that the other slots' bits stay. seq_cst orders them against nothing in
     * another process: /readyz loads `late` relaxed (kvr_seg_status) and may see a change
     * one probe late; it only keeps them in one order with this thread's seq_cst stores of
     * readiness (take_readiness, give_readiness). */
    if (late)
        kvr_atomic_fetch_or_seq_cst(&s->seg.hdr->ctl.late, bit);
    else
        kvr_atomic_fetch_and_seq_cst(&s->seg.hdr->ctl.late, ~bit);
}

/* First sight of a child's ready flag: it serves. A replacement's is logged, and clears the
 * late mark its predecessor left (readiness is back once every slot has a serving process);
 * logged first, so that a /readyz 200 it allows is never seen before the line. */
static void seen_serving(sup_t *s, child_t *c, uint64_t t)
{
    c->serving = 1;
    if (c->prev_pid != 0)
        kvr_info("%s %d (pid %d) serving: replaces pid %d (%s) %llu ms after its death", role_name(c), c->index,
                 (int)c->pid, (int)c->prev_pid, c->prev_hung ? "hung" : "died",
                 (unsigned long long)(t > c->died_ms ? t - c->died_ms : 0));
    mark_late(s, c, 0);
}

/*
 * The watchdog, in two steps. A serving child whose heartbeat has not moved for half of
 * --hang-timeout is suspect: it leaves readiness at once (/readyz 503, so that balancers
 * stop sending it connections) and comes back if its heartbeat moves again (a long but
 * finite stall). One still for the whole --hang-timeout is hung (a loop, a blocked
 * syscall, SIGSTOP): logged and SIGKILLed, which turns the hang into an ordinary death that
 * reap_children repairs and replaces.
 */
static void watchdog(sup_t *s, uint64_t t)
{
    uint64_t limit = s->cfg->hang_timeout_ms;

    for (int i = 0; i < s->nch && !s->draining; i++) {
        child_t *c = &s->ch[i];
        uint64_t hb, still;
        if (c->state != CH_RUNNING || c->hung)
            continue;
        /* acquire: pairs with the child's release store of ready once it serves */
        if (!c->serving && kvr_atomic_load_acquire(&s->seg.procs[c->slot].ready))
            seen_serving(s, c, t);
        hb = kvr_atomic_load_relaxed(&s->seg.procs[c->slot].heartbeat); /* a count: compared only */
        if (hb != c->hb_seen || (!c->suspect && !kvr_atomic_load_acquire(&s->seg.procs[c->slot].ready))) {
            c->hb_seen = hb; /* moving, or still starting up: not judged */
            c->hb_at_ms = t;
            if (c->suspect) {
                c->suspect = 0;
                give_readiness(s, c);
                mark_late(s, c, 0);
                kvr_warn("%s %d (pid %d): heartbeat moves again; ready", role_name(c), c->index, (int)c->pid);
            }
            continue;
        }
        still = t > c->hb_at_ms ? t - c->hb_at_ms : 0; /* a child spawned after t was sampled */
        if (!c->suspect && still >= limit / 2 && take_readiness(s, c)) {
            c->suspect = 1;
            mark_late(s, c, 1);
            kvr_warn("%s %d (pid %d): no heartbeat for %llu ms; out of readiness", role_name(c), c->index, (int)c->pid,
                     (unsigned long long)still);
        }
        if (still < limit)
            continue;
        c->hung = 1;
        take_readiness(s, c);
        kvr_atomic_fetch_add_relaxed(&s->seg.hdr->ctl.hangs_killed, 1); /* a counter for /metrics */
        kvr_warn("%s %d (pid %d) hung: no heartbeat for %llu ms; killing it", role_name(c), c->index, (int)c->pid,
                 (unsigned long long)still);
        kill(c->pid, SIGKILL);
    }
}

/* Signals another process sends on purpose (an operator, an orchestrator, the OOM killer's
 * SIGKILL): the child did nothing wrong, so it is replaced at once. */
static int outside_signal(int sig)
{
    return sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT || sig == SIGUSR1 ||
           sig == SIGUSR2;
}

/* When to replace a child that just died (see the policy at the top of the file). */
static uint64_t respawn_delay(child_t *c, int status, uint64_t t)
{
    uint64_t delay;

    if (c->hung || (WIFSIGNALED(status) && outside_signal(WTERMSIG(status))))
        return 0;
    c->young_deaths = t - c->started_ms < YOUNG_MS ? c->young_deaths + 1 : 0;
    delay = c->young_deaths <= 1 ? 0 : BACKOFF_MIN_MS << (c->young_deaths > 8 ? 7 : c->young_deaths - 2);
    return delay > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : delay;
}

static void reap_children(sup_t *s)
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        child_t *c = find_child(s, pid);
        uint64_t t = kvr_clock_ms(), delay;
        if (c == NULL)
            continue;
        take_readiness(s, c);
        kvr_store_reap_slot(&s->store, c->slot);
        if (s->seg.hdr->ckf_buckets)
            kvr_relay_release_all(&s->relay, c->slot);
        if (WIFSIGNALED(status))
            kvr_log(s->draining ? KVR_LOG_INFO : KVR_LOG_WARN, "%s %d (pid %d) killed by signal %d",
                    c->role == KVR_ROLE_PUBLISHER ? "publisher" : "worker", c->index, (int)pid, WTERMSIG(status));
        else
            kvr_log(s->draining ? KVR_LOG_INFO : KVR_LOG_WARN, "%s %d (pid %d) exited with status %d",
                    c->role == KVR_ROLE_PUBLISHER ? "publisher" : "worker", c->index, (int)pid, WEXITSTATUS(status));
        c->state = CH_WAITING;
        c->prev_pid = pid;
        c->prev_hung = c->hung;
        c->pid = 0;
        if (s->draining) {
            c->state = CH_EMPTY;
            continue;
        }
        delay = respawn_delay(c, status, t);
        c->died_ms = t;
        c->respawn_at = t + delay;
        kvr_atomic_fetch_add_relaxed(c->role == KVR_ROLE_PUBLISHER ? &s->seg.hdr->ctl.publisher_restarts
                                                                   : &s->seg.hdr->ctl.worker_restarts,
                                     1); /* counters for /metrics */
        if (delay > 0)
            kvr_warn("%s %d keeps crashing young: respawn in %llu ms", role_name(c), c->index,
                     (unsigned long long)delay);
    }
}

/*
 * Starts the children whose respawn time has come. When no worker is running, the waiting
 * worker due first is started no later than 100 ms after its death, whatever its back-off:
 * back-off must never leave the server without a worker. Returns the ms until the next
 * respawn is due (at most 1000).
 */
static uint64_t respawn_due(sup_t *s, uint64_t t)
{
    child_t *first = NULL;
    uint64_t wait_ms = 1000;
    int running = 0;

    for (int i = 0; i < s->nch; i++)
        running += s->ch[i].state == CH_RUNNING && s->ch[i].role == KVR_ROLE_WORKER;
    for (int i = 0; i < s->nch; i++) {
        child_t *c = &s->ch[i];
        if (c->state == CH_WAITING && c->role == KVR_ROLE_WORKER && (first == NULL || c->respawn_at < first->respawn_at))
            first = c;
    }
    if (running == 0 && first != NULL && first->respawn_at > first->died_ms + BACKOFF_MIN_MS) {
        kvr_warn("no worker is running: worker %d restarts without its back-off", first->index);
        first->respawn_at = first->died_ms + BACKOFF_MIN_MS;
    }
    for (int i = 0; i < s->nch; i++) {
        child_t *c = &s->ch[i];
        if (c->state != CH_WAITING)
            continue;
        if (c->respawn_at <= t)
            spawn(s, c);
        else if (c->respawn_at - t < wait_ms)
            wait_ms = c->respawn_at - t;
    }
    return wait_ms;
}

static void start_drain(sup_t *s)
{
    if (s->draining)
        return;
    s->draining = 1;
    s->drain_deadline = kvr_clock_ms() + s->cfg->shutdown_grace_ms + 1000;
    /* relaxed: /readyz loads it relaxed (kvr_seg_status); the drain itself reaches the
     * children by signal */
    kvr_atomic_store_relaxed(&s->seg.hdr->ctl.draining, 1);
    kvr_info("draining: stopping %d processes (grace %llu ms)", s->nch, (unsigned long long)s->cfg->shutdown_grace_ms);
    if (s->http_fd >= 0) {
        close(s->http_fd);
        s->http_fd = -1;
    }
    for (int i = 0; i < s->nch; i++) {
        child_t *c = &s->ch[i];
        if (c->grpc_fd >= 0) {
            close(c->grpc_fd);
            c->grpc_fd = -1;
        }
        if (c->state == CH_RUNNING)
            kill(c->pid, SIGTERM);
        else
            c->state = CH_EMPTY;
    }
}

static int any_running(sup_t *s)
{
    for (int i = 0; i < s->nch; i++)
        if (s->ch[i].state == CH_RUNNING)
            return 1;
    return 0;
}

/* The KV events' endpoints with a port to pick ("tcp://HOST:*"): picked once, here, so that a
 * replacement publisher binds the same port (docs/kv-events.md). */
static int resolve_kv_events(kvr_config_t *cfg)
{
    char *eps[2] = {cfg->kv_events_bind, cfg->kv_events_replay_bind};

    for (int i = 0; i < 2; i++)
        if (eps[i][0] != '\0' && kvr_kvev_resolve_endpoint(eps[i], KVR_CFG_STR_MAX) < 0) {
            kvr_error("--kv-events-%sbind %s: give a numeric address and port", i ? "replay-" : "", eps[i]);
            return KVR_ERR;
        }
    return KVR_OK;
}

static int write_port_file(const kvr_config_t *cfg, const char *http, const char *grpc)
{
    const char *path = cfg->port_file;
    const char *eps[2] = {cfg->kv_events_bind, cfg->kv_events_replay_bind};
    const char *names[2] = {"kv_events", "kv_events_replay"};
    char tmp[KVR_CFG_STR_MAX + 8];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if ((f = fopen(tmp, "w")) == NULL) {
        kvr_error("port file %s: %s", tmp, strerror(errno));
        return KVR_ERR;
    }
    fprintf(f, "http=%s\ngrpc=%s\n", http, grpc);
    for (int i = 0; i < 2; i++) {
        const char *colon = strrchr(eps[i], ':');
        if (eps[i][0] != '\0' && strncmp(eps[i], "tcp://", 6) == 0 && colon != NULL)
            fprintf(f, "%s=%s\n", names[i], colon + 1);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        kvr_error("port file %s: %s", path, strerror(errno));
        return KVR_ERR;
    }
    return KVR_OK;
}

/*
 * Formats the relay state: a new incarnation every start. On a re-attached segment the
 * previous run's generation and catalog revision are carried over so that the publisher's
 * first generation (+1 each) moves past everything a subscriber of that run saw.
 */
static int relay_start(sup_t *s, const kvr_config_t *cfg)
{
    kvr_relay_sh_t *rs = kvr_seg_at(&s->seg, s->seg.hdr->off_relay);
    uint64_t gen = 0, rev = 0;

    if (s->seg.attached) {
        /* relaxed here and below: before the first fork, no other process maps the segment
         * (the file lock keeps the previous run's out) */
        gen = kvr_atomic_load_relaxed(&rs->generation);
        rev = kvr_atomic_load_relaxed(&rs->catalog_revision);
    }
    if (kvr_relay_format(&s->relay, &s->seg, cfg) != KVR_OK)
        return KVR_ERR;
    kvr_atomic_store_relaxed(&s->relay.sh->generation, gen);
    kvr_atomic_store_relaxed(&s->relay.sh->catalog_revision, rev);
    if (s->seg.attached)
        kvr_info("relay: re-attached segment: previous generation %llu, catalog revision %llu",
                 (unsigned long long)gen, (unsigned long long)rev);
    return KVR_OK;
}

/* The pool of (default, --model) exists from the start: the catalog lists it before any PUT,
 * as it always did. Made first on a new segment, so it is pool 0 there. */
static int default_pool(sup_t *s)
{
    const char *m = s->cfg->model;
    int rc;

    if (!kvr_model_valid(m, strlen(m))) {
        kvr_error("--model must be 1 to %d printable bytes without spaces, got '%s'", KVR_MODEL_MAX, m);
        return KVR_ERR;
    }
    rc = kvr_store_pool(&s->store, KVR_NS_DEFAULT, "default", m, strlen(m), (uint32_t)s->cfg->max_pools_per_ns);
    if (rc == KVR_ENOSPACE || rc == KVR_EQUOTA)
        kvr_warn("relay: no pool for (default, %s): the segment's --max-pools or the namespace's "
                 "--max-pools-per-namespace are taken; its PUTs without X-KV-Model get 507",
                 m);
    return rc == KVR_ENOSPACE || rc == KVR_EQUOTA || rc >= 0 ? KVR_OK : KVR_ERR;
}

/* --workers, or one per CPU this process may run on (its affinity mask: a container's cpuset;
 * the online CPUs when the mask cannot be read); the table keeps one entry for the publisher. */
static int worker_count(const kvr_config_t *cfg)
{
    cpu_set_t set;
    long ncpu = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    int n = cfg->workers ? (int)cfg->workers : (ncpu > 0 ? (int)ncpu : 1);

    return n > MAX_CHILDREN - 1 ? MAX_CHILDREN - 1 : n;
}

/* The segment's geometry from the flags. The filter is sized from the index capacity the
 * layout really gives (--max-blocks 0 derives it from the arena), so a probe layout comes first. */
static int segment_config(const kvr_config_t *cfg, kvr_seg_config_t *sc)
{
    kvr_seg_hdr_t probe;
    kvr_seg_config_t c0;

    sc->memory = cfg->memory;
    sc->page_size = (uint32_t)cfg->page_size;
    sc->max_blocks = cfg->max_blocks;
    sc->log_capacity = cfg->change_log_events;
    sc->hugepages = !strcmp(cfg->hugepages, "off")     ? KVR_HUGEPAGES_OFF
                  : !strcmp(cfg->hugepages, "require") ? KVR_HUGEPAGES_REQUIRE
                                                       : KVR_HUGEPAGES_AUTO;
    c0 = *sc;
    if (kvr_seg_layout(&c0, &probe) != KVR_OK) {
        kvr_error("invalid sizing: --memory %llu, --page-size %llu, --max-blocks %llu",
                  (unsigned long long)cfg->memory, (unsigned long long)cfg->page_size,
                  (unsigned long long)cfg->max_blocks);
        return KVR_ERR;
    }
    sc->ckf_buckets = kvr_relay_bucket_count(cfg, probe.max_blocks);
    sc->relay_pools = (uint32_t)cfg->max_pools;
    sc->ssd_slots = cfg->ssd_path[0] ? cfg->ssd_slots : 0;
    sc->path = cfg->segment_path[0] ? cfg->segment_path : NULL;
    sc->reset = cfg->segment_reset;
    sc->lock_wait_ms = KVR_SEG_LOCK_WAIT_MS; /* a killed run's lock outlives its processes briefly */
    return KVR_OK;
}

/* --max-block-size larger than the arena can ever hold is lowered to that (before any child
 * forks: every process then decides 413 on the same number), so that such a PUT is refused
 * from its head instead of receiving its whole body for a 507. */
static void clamp_block_size(kvr_config_t *cfg, const kvr_store_t *st)
{
    uint64_t max = kvr_store_block_max(st);

    if (cfg->max_block_size > max) {
        kvr_info("max block size %llu bytes: --max-block-size %llu is more than the arena holds (%llu bytes "
                 "less the longest key)",
                 (unsigned long long)max, (unsigned long long)cfg->max_block_size,
                 (unsigned long long)(max + KVR_KEY_MAX));
        cfg->max_block_size = max;
    } else {
        kvr_info("max block size %llu bytes (--max-block-size)", (unsigned long long)cfg->max_block_size);
    }
}

/* Maps the segment: a new one is formatted, a kept one re-attached and repaired; then sealed. */
static int segment_open(sup_t *s, const kvr_seg_config_t *sc)
{
    uint64_t t0 = kvr_clock_ms();

    if (kvr_seg_create(&s->seg, sc) != KVR_OK)
        return KVR_ERR;
    if (s->seg.attached ? kvr_store_attach(&s->seg, s->cfg->no_evict) : kvr_store_format(&s->seg, s->cfg->no_evict))
        return KVR_ERR;
    if (s->seg.attached)
        kvr_tenants_attach(&s->seg); /* the namespace ids of the last run stay */
    else
        kvr_tenants_format(&s->seg);
    kvr_seg_seal(&s->seg);
    if (s->seg.attached)
        kvr_info("segment: re-attach and repair in reattach_ms=%llu", (unsigned long long)(kvr_clock_ms() - t0));
    return KVR_OK;
}

/* The child table: the workers' one HTTP listener; per worker a gRPC listener of a
 * SO_REUSEPORT group (the first fixes an ephemeral port for the rest) and its wake-up
 * eventfds; the publisher last, with no listener. */
static int add_children(sup_t *s, int nworkers)
{
    const kvr_config_t *cfg = s->cfg;
    uint16_t http_port = 0, grpc_port = 0;
    int grpc_on = strcmp(cfg->grpc_bind, "off") != 0;
    child_t *c;

    s->http_fd = kvr_listen_tcp(cfg->http_bind, &http_port, 1024);
    if (s->http_fd < 0)
        return KVR_ERR;
    for (int i = 0; i < nworkers; i++) {
        c = &s->ch[s->nch++];
        memset(c, 0, sizeof(*c));
        c->role = KVR_ROLE_WORKER;
        c->index = i;
        c->slot = 1 + i;
        c->grpc_fd = -1;
        if (grpc_on && (c->grpc_fd = kvr_listen_tcp(cfg->grpc_bind, &grpc_port, 1024)) < 0)
            return KVR_ERR;
        s->fds.worker[c->slot] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        s->fds.accept[c->slot] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    }
    c = &s->ch[s->nch++];
    memset(c, 0, sizeof(*c));
    c->role = KVR_ROLE_PUBLISHER;
    c->slot = 1 + nworkers;
    c->grpc_fd = -1;
    return KVR_OK;
}

/* Logs the bound addresses and writes --port-file (how tests find an ephemeral port). */
static int announce_listeners(sup_t *s, int nworkers)
{
    const kvr_config_t *cfg = s->cfg;
    char http_name[300], grpc_name[300] = "off";
    const char *auth = cfg->tenants[0] ? "tenants file" : cfg->token[0] ? "bearer token"
                                                                        : "none";

    kvr_listen_name(s->http_fd, http_name, sizeof(http_name));
    kvr_info("HTTP on %s%s, %d workers, arena %llu bytes, auth %s", http_name, cfg->tls_cert[0] ? " (TLS)" : "",
             nworkers, (unsigned long long)s->seg.hdr->arena_bytes, auth);
    if (strcmp(cfg->grpc_bind, "off") != 0) {
        kvr_listen_name(s->ch[0].grpc_fd, grpc_name, sizeof(grpc_name));
        kvr_info("gRPC relay (dynamo.kvrelay.v1) on %s", grpc_name);
    }
    if (cfg->port_file[0] && write_port_file(cfg, http_name, grpc_name) != KVR_OK)
        return KVR_ERR;
    return KVR_OK;
}

/* What readiness counts against, and the start time /metrics reports. */
static void publish_expected(sup_t *s, int nworkers)
{
    /* relaxed: before the first fork, which publishes them to every child */
    kvr_atomic_store_relaxed(&s->seg.hdr->ctl.workers_expected, (uint32_t)nworkers);
    kvr_atomic_store_relaxed(&s->seg.hdr->ctl.publisher_expected, 1);
    kvr_atomic_store_relaxed(&s->seg.hdr->ctl.started_unix_ms, kvr_clock_wall_ms());
}

/* SIGPIPE ignored; the signals the main loop takes stay blocked from here on (see the top of
 * the file). spawn gives each child the old mask back. */
static void block_signals(sup_t *s)
{
    struct sigaction ign;

    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, NULL);
    sigemptyset(&s->sigs);
    sigaddset(&s->sigs, SIGCHLD);
    sigaddset(&s->sigs, SIGTERM);
    sigaddset(&s->sigs, SIGINT);
    sigaddset(&s->sigs, SIGHUP);
    sigprocmask(SIG_BLOCK, &s->sigs, &s->oldmask);
}

/* Draining past the deadline: SIGKILL every child still running, and again each second. */
static void kill_stragglers(sup_t *s, uint64_t t)
{
    if (t < s->drain_deadline)
        return;
    for (int i = 0; i < s->nch; i++)
        if (s->ch[i].state == CH_RUNNING) {
            kvr_warn("child in slot %d (pid %d) did not stop in time: killing it", s->ch[i].slot, (int)s->ch[i].pid);
            kill(s->ch[i].pid, SIGKILL);
        }
    s->drain_deadline = t + 1000;
}

/* After every publication of the tenants table (we are its only writer, so it is read
 * plainly): the namespaces' memory= for the store's evictions and ssd= for the disk writer's
 * (one store lock), and the pool
 * of each configured namespace's default model, made now so that other namespaces' models can
 * never take its place (docs/tenancy.md, "Pools"). */
static void push_tenants(sup_t *s)
{
    const kvr_tenants_sh_t *t = kvr_seg_at(&s->seg, s->seg.hdr->off_tenants);
    uint64_t q[KVR_NS_MAX], ssd[KVR_NS_MAX];

    for (unsigned ns = 0; ns < KVR_NS_MAX; ns++) {
        q[ns] = t->ns[ns].configured ? t->ns[ns].quota : 0;
        ssd[ns] = t->ns[ns].configured ? t->ns[ns].ssd_quota : 0;
    }
    kvr_store_set_quotas(&s->store, q, ssd);
    for (unsigned ns = 1; ns < KVR_NS_MAX; ns++) {
        const char *m = t->ns[ns].model[0] ? t->ns[ns].model : s->cfg->model;
        int rc;
        if (!t->ns[ns].configured)
            continue;
        rc = kvr_store_pool(&s->store, (uint16_t)ns, t->ns[ns].name, m, strlen(m), (uint32_t)s->cfg->max_pools_per_ns);
        if (rc == KVR_ENOSPACE || rc == KVR_EQUOTA)
            KVR_LOG_RATELIMITED(KVR_LOG_WARN, "relay: no pool for (%s, %s): --max-pools or --max-pools-per-namespace "
                                              "are taken",
                                t->ns[ns].name, m);
    }
}

/* Waits up to wait_ms for one of the blocked signals and acts on it. */
static void take_signal(sup_t *s, uint64_t wait_ms)
{
    struct timespec to;
    siginfo_t si;
    int sig;

    to.tv_sec = (time_t)(wait_ms / 1000);
    to.tv_nsec = (long)(wait_ms % 1000) * 1000000L;
    sig = sigtimedwait(&s->sigs, &si, &to);
    if (sig == SIGTERM || sig == SIGINT) {
        kvr_info("received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        start_drain(s);
    } else if (sig == SIGHUP && !s->draining) {
        kvr_tenants_src_reload(&s->tenants, &s->seg, "SIGHUP");
        push_tenants(s);
    }
}

/* The main loop; returns once a drain has seen every child stop. */
static void supervise(sup_t *s)
{
    for (;;) {
        uint64_t t = kvr_clock_ms(), wait_ms = 1000;

        if (!s->draining)
            wait_ms = respawn_due(s, t);
        watchdog(s, kvr_clock_ms()); /* after respawn_due: t may predate a child it just started */
        if (wait_ms > 250)
            wait_ms = 250; /* sample heartbeats often enough (--hang-timeout >= 500 ms) */
        if (s->draining) {
            if (!any_running(s))
                return;
            kill_stragglers(s, t);
            wait_ms = 100;
        }
        if (!s->draining && kvr_tenants_src_poll(&s->tenants, &s->seg, kvr_clock_ms())) /* the file changed */
            push_tenants(s);
        take_signal(s, wait_ms);
        /* SIGCHLD, a timeout or an interrupt: reap whatever is there. */
        reap_children(s);
    }
}

/* The disk tier's file, before the segment: made when new, refused (exit 2, untouched) when
 * it is not ours or was made with another size or page size. The disk writer opens it again. */
static int ssd_check(const kvr_config_t *cfg)
{
    kvr_ssdf_t f;

    if (cfg->ssd_path[0] == '\0' || kvr_ssdf_open(&f, cfg->ssd_path, cfg->ssd_size, cfg->ssd_page_size, NULL) != KVR_OK)
        return cfg->ssd_path[0] == '\0' ? KVR_OK : KVR_ERR;
    kvr_ssdf_close(&f);
    return KVR_OK;
}

int kvr_supervisor_run(kvr_config_t *cfg)
{
    static sup_t sup;
    sup_t *s = &sup;
    kvr_seg_config_t sc = {0};
    int nworkers = worker_count(cfg);
    char err[512];

    kvr_log_set_role("supervisor");
    kvr_proctitle_set("kvrelay: supervisor");
    s->cfg = cfg;
    /* The I/O engine is decided here, once, before any fork: a worker that could not make a
     * ring would exit and be respawned forever (docs/dataplane.md, "I/O engines"). */
    if (kvr_uring_select(cfg->io_engine) != KVR_OK)
        return 1;
    /* The tenants file before the segment: a malformed one refuses the start, naming its line,
     * like any other configuration error (exit 2), and leaves a segment file untouched. */
    if (kvr_tenants_src_init(&s->tenants, cfg, err, sizeof(err)) != KVR_OK) {
        kvr_error("%s", err);
        return 2;
    }
    if (ssd_check(cfg) != KVR_OK)
        return 2;
    if (segment_config(cfg, &sc) != KVR_OK || segment_open(s, &sc) != KVR_OK)
        return 1;
    if (kvr_seg_proc_claim_at(&s->seg, 0, KVR_ROLE_SUPERVISOR) != 0 || kvr_store_open(&s->store, &s->seg) != KVR_OK)
        return 1;
    clamp_block_size(cfg, &s->store);
    if (default_pool(s) != KVR_OK)
        return 2;
    if (relay_start(s, cfg) != KVR_OK)
        return 1;
    if (kvr_tenants_src_publish(&s->tenants, &s->seg, err, sizeof(err)) != KVR_OK) {
        kvr_error("%s", err);
        return 2;
    }
    push_tenants(s);
    /* Wake-up eventfds for every process slot, made before any fork. */
    s->fds.publisher = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    for (int i = 0; i < KVR_MAX_PROCS; i++)
        s->fds.worker[i] = s->fds.accept[i] = -1;
    s->http_fd = -1;
    kvr_relay_attach(&s->relay, &s->seg, cfg, &s->fds);
    if (add_children(s, nworkers) != KVR_OK || resolve_kv_events(cfg) != KVR_OK)
        return 1;
    s->store.notify_fd = s->fds.publisher;
    if (announce_listeners(s, nworkers) != KVR_OK)
        return 1;
    publish_expected(s, nworkers);
    block_signals(s);

    for (int i = 0; i < s->nch; i++)
        if (spawn(s, &s->ch[i]) != KVR_OK)
            return 1;
    supervise(s);
    kvr_info("all workers stopped; exiting");
    kvr_tenants_src_free(&s->tenants);
    kvr_seg_destroy(&s->seg);
    return 0;
}
