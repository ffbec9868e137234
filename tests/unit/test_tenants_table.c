/*
 * Unit tests of the tenants table in the segment (src/core/tenants_table.c): namespace ids
 * stay what they were across reloads that reorder, remove and re-add names, and across a warm
 * restart; a full registry refuses a new name and keeps the old table; --token and
 * --admin-token; authentication, open access, the per-connection cache; and the seqlock: a
 * reader in another process copying while the writer publishes only ever sees whole tables.
 */
#include "base/log.h"
#include "core/store.h"
#include "core/tenants_table.h"
#include "shm/segment.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static kvr_seg_t seg;
static kvr_tenants_t tab;
static kvr_tenants_view_t view;
static char err[512];
static char path[128];

static void open_seg(const char *file)
{
    kvr_seg_config_t c = {0};

    kvr_log_level = KVR_LOG_OFF;
    c.memory = 8 << 20;
    c.page_size = 4096;
    c.max_blocks = 256;
    c.hugepages = KVR_HUGEPAGES_OFF;
    c.path = file;
    cr_assert_eq(kvr_seg_create(&seg, &c), KVR_OK);
    if (seg.attached) {
        cr_assert_eq(kvr_store_attach(&seg, 0), KVR_OK);
        kvr_tenants_attach(&seg);
    } else {
        cr_assert_eq(kvr_store_format(&seg, 0), KVR_OK);
        kvr_tenants_format(&seg);
    }
    kvr_seg_seal(&seg);
}

static void setup(void)
{
    open_seg(NULL);
}

static void teardown(void)
{
    kvr_seg_destroy(&seg);
    if (path[0] != '\0')
        unlink(path);
}

/* Parses text and publishes it; returns publish's status. */
static int publish_text(const char *text, const char *token, const char *admin)
{
    uint8_t td[32], ad[32];
    uint64_t gen;

    cr_assert_eq(kvr_tenants_parse(text, strlen(text), &tab, err, sizeof(err)), KVR_OK, "%s", err);
    if (token)
        kvr_tenants_digest(token, strlen(token), td);
    if (admin)
        kvr_tenants_digest(admin, strlen(admin), ad);
    return kvr_tenants_publish(&seg, &tab, token ? td : NULL, admin ? ad : NULL, &gen, err, sizeof(err));
}

static int id_of(const char *name)
{
    kvr_tenants_view_init(&view, &seg);
    return kvr_tenants_ns_find(&view, name);
}

/* Authenticates tok; returns the namespace id, or -1 when refused. */
static int auth(const char *tok, int *admin)
{
    uint16_t ns = 99;
    int a = 7;

    if (!kvr_tenants_auth(&view, tok, strlen(tok), &ns, &a)) {
        cr_assert_eq(ns, 0);
        cr_assert_eq(a, 0);
        return -1;
    }
    if (admin)
        *admin = a;
    return ns;
}

TestSuite(tenants_table, .init = setup, .fini = teardown);

Test(tenants_table, a_new_segment_is_open_access_with_default_only)
{
    kvr_tenants_view_init(&view, &seg);
    cr_assert(kvr_tenants_open_access(&view));
    cr_assert_str_eq(kvr_tenants_ns_name(&view, KVR_NS_DEFAULT), "default");
    cr_assert(kvr_tenants_ns_configured(&view, KVR_NS_DEFAULT));
    cr_assert_null(kvr_tenants_ns_name(&view, 1));
    cr_assert_null(kvr_tenants_ns_name(&view, KVR_NS_MAX));
    cr_assert_eq(auth("anything", NULL), -1);
}

Test(tenants_table, tokens_name_their_namespaces)
{
    int admin = -1;

    cr_assert_eq(publish_text("a ta1 memory=1G ssd=2G model=m-a\nb tb\na ta2\n", "legacy", "root"), KVR_OK, "%s", err);
    kvr_tenants_view_init(&view, &seg);
    cr_assert_not(kvr_tenants_open_access(&view));
    cr_assert_eq(auth("ta1", &admin), 1);
    cr_assert_eq(admin, 0);
    cr_assert_eq(auth("ta2", NULL), 1, "rotation: both tokens of a");
    cr_assert_eq(auth("tb", NULL), 2);
    cr_assert_eq(auth("legacy", &admin), KVR_NS_DEFAULT, "--token is namespace default");
    cr_assert_eq(admin, 0);
    cr_assert_eq(auth("root", &admin), KVR_NS_DEFAULT);
    cr_assert_eq(admin, 1, "the admin token");
    cr_assert_eq(auth("ta", NULL), -1);
    cr_assert_eq(auth("", NULL), -1);
    cr_assert_eq(kvr_tenants_ns_quota(&view, 1), 1ull << 30);
    cr_assert_eq(kvr_tenants_ns_ssd_quota(&view, 1), 2ull << 30);
    cr_assert_eq(kvr_tenants_ns_ssd_quota(&view, 2), 0);
    cr_assert_str_eq(kvr_tenants_ns_model(&view, 1), "m-a");
    cr_assert_null(kvr_tenants_ns_model(&view, 2));
}

Test(tenants_table, only_an_admin_token_leaves_data_open)
{
    cr_assert_eq(publish_text("", NULL, "root"), KVR_OK, "%s", err);
    kvr_tenants_view_init(&view, &seg);
    cr_assert(kvr_tenants_open_access(&view));
    cr_assert_eq(publish_text("", "legacy", NULL), KVR_OK, "%s", err);
    kvr_tenants_view_refresh(&view);
    cr_assert_not(kvr_tenants_open_access(&view), "--token alone closes it");
}

Test(tenants_table, token_collisions_are_refused)
{
    cr_assert_eq(publish_text("a x\n", "x", NULL), KVR_EINVAL);
    cr_assert_str_eq(err, "tenants: line 1: the same token as --token");
    cr_assert_eq(publish_text("a y\nb x\n", NULL, "x"), KVR_EINVAL);
    cr_assert_str_eq(err, "tenants: line 2: the same token as --admin-token");
    cr_assert_eq(publish_text("", "x", "x"), KVR_EINVAL);
    cr_assert(strstr(err, "--admin-token is the same token as --token") != NULL);
}

Test(tenants_table, ids_survive_reorder_remove_and_readd)
{
    int a, b, c;

    cr_assert_eq(publish_text("a t1\nb t2\nc t3\n", NULL, NULL), KVR_OK);
    a = id_of("a"), b = id_of("b"), c = id_of("c");
    cr_assert(a > 0 && b > 0 && c > 0 && a != b && b != c && a != c);
    cr_assert_eq(publish_text("c t3\nb t2\na t1\n", NULL, NULL), KVR_OK, "reordered");
    cr_assert_eq(id_of("a"), a);
    cr_assert_eq(id_of("b"), b);
    cr_assert_eq(id_of("c"), c);
    cr_assert_eq(publish_text("c t3\na t1 memory=1M ssd=1G\n", NULL, NULL), KVR_OK, "b removed");
    cr_assert_eq(id_of("b"), b, "a removed namespace keeps its slot");
    cr_assert_not(kvr_tenants_ns_configured(&view, (uint16_t)b));
    cr_assert_eq(auth("t2", NULL), -1, "and its tokens are gone");
    cr_assert_eq(auth("t1", NULL), a);
    cr_assert_eq(publish_text("d t4\nb t2b\n", NULL, NULL), KVR_OK, "b back, d new, a and c removed");
    cr_assert_eq(id_of("b"), b, "re-added: its old id");
    cr_assert(kvr_tenants_ns_configured(&view, (uint16_t)b));
    cr_assert_eq(auth("t2b", NULL), b);
    int d = id_of("d");
    cr_assert(d != a && d != b && d != c, "a new name takes a free slot, not a removed one's");
    cr_assert_eq(kvr_tenants_ns_quota(&view, (uint16_t)a), 0, "a removed namespace has no quota");
    cr_assert_eq(kvr_tenants_ns_ssd_quota(&view, (uint16_t)a), 0, "nor an ssd= one");
}

Test(tenants_table, a_full_registry_refuses_a_new_name_and_keeps_the_table)
{
    char text[64 * 24], *p = text;
    uint64_t g;

    for (int i = 1; i < KVR_NS_MAX; i++)
        p += sprintf(p, "n%d t%d\n", i, i);
    cr_assert_eq(publish_text(text, NULL, NULL), KVR_OK, "%s", err);
    cr_assert_eq(publish_text("n1 t1\n", NULL, NULL), KVR_OK, "62 removed");
    kvr_tenants_view_init(&view, &seg);
    g = kvr_tenants_view_generation(&view);
    cr_assert_eq(publish_text("n1 t1\n\nfresh tf\n", NULL, NULL), KVR_EINVAL, "every id is taken");
    cr_assert(strstr(err, "tenants: line 3: namespace \"fresh\" is new, but all 63 namespace ids are taken") != NULL,
              "%s", err);
    cr_assert_eq(kvr_tenants_view_refresh(&view), 0, "the table did not move");
    cr_assert_eq(kvr_tenants_view_generation(&view), g);
    cr_assert_eq(auth("t1", NULL), id_of("n1"));
    cr_assert_eq(publish_text("n5 t5\n", NULL, NULL), KVR_OK, "an old name comes back");
}

Test(tenants_table, a_warm_restart_keeps_the_ids)
{
    int a, b;

    kvr_seg_destroy(&seg);
    snprintf(path, sizeof(path), "/dev/shm/kvrelay-unit-%d-tenants.seg", (int)getpid());
    unlink(path);
    open_seg(path);
    cr_assert_eq(publish_text("a t1\nb t2\n", NULL, NULL), KVR_OK);
    a = id_of("a"), b = id_of("b");
    cr_assert_eq(publish_text("b t2\n", NULL, NULL), KVR_OK);
    kvr_seg_destroy(&seg);
    open_seg(path);
    cr_assert(seg.attached);
    cr_assert_eq(publish_text("new t3\nb t2\na t1\n", NULL, NULL), KVR_OK);
    cr_assert_eq(id_of("a"), a, "removed before the restart, its id kept");
    cr_assert_eq(id_of("b"), b);
    cr_assert(id_of("new") != a && id_of("new") != b);
}

/* Two tables that differ everywhere: every token of a copy must name the same namespace, and
 * the count must be that table's. */
#define ROUNDS 3000

static void writer(void)
{
    static char a[64 * 40], b[64 * 40];
    char *p = a, *q = b;
    uint64_t gen;

    for (int i = 0; i < 40; i++)
        p += sprintf(p, "alpha a%d\n", i);
    for (int i = 0; i < 60; i++)
        q += sprintf(q, "beta b%d memory=1M\n", i);
    for (int r = 0; r < ROUNDS; r++) {
        const char *t = r & 1 ? b : a;
        if (kvr_tenants_parse(t, strlen(t), &tab, err, sizeof(err)) != KVR_OK ||
            kvr_tenants_publish(&seg, &tab, NULL, NULL, &gen, err, sizeof(err)) != KVR_OK)
            _exit(2);
    }
    _exit(0);
}

Test(tenants_table, a_reader_copies_only_whole_tables)
{
    pid_t pid;
    int status, copies = 0, bad = 0;

    cr_assert_eq(publish_text("alpha a0\n", NULL, NULL), KVR_OK);
    cr_assert_eq(publish_text("beta b0\n", NULL, NULL), KVR_OK, "both names have ids before the race");
    kvr_tenants_view_init(&view, &seg);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        writer();
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (kvr_tenants_view_refresh(&view) != 1)
            continue;
        const kvr_tenants_copy_t *c = &view.buf[view.cur];
        uint16_t ns0 = c->nuser ? c->tok[0].ns : 0;
        copies++;
        if (c->nuser != 1 && c->nuser != 40 && c->nuser != 60)
            bad++;
        for (uint32_t i = 0; i < c->nuser; i++)
            bad += c->tok[i].ns != ns0;
        if (c->nuser == 60 && kvr_tenants_ns_quota(&view, ns0) != (1u << 20))
            bad++;
        if (c->nuser == 40 && kvr_tenants_ns_quota(&view, ns0) != 0)
            bad++;
    }
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the writer published every round");
    cr_assert_eq(bad, 0, "%d torn copies out of %d", bad, copies);
    cr_assert_gt(copies, 0);
    kvr_tenants_view_refresh(&view);
    cr_assert_eq(kvr_tenants_view_generation(&view) / 2, ROUNDS + 2, "the last table");
    cr_assert_eq(view.buf[view.cur].nuser, 60);
}
