/*
 * proctitle.h — process titles, as nginx sets them: `ps` and `top` show what each kvrelay
 * process is ("kvrelay: worker 1", "kvrelay: publisher", "kvrelay: supervisor").
 *
 * Two places hold a name: the kernel's comm (prctl(PR_SET_NAME), 15 bytes, shown by top and
 * in /proc/PID/comm) and the argument area the kernel reports as /proc/PID/cmdline (shown by
 * ps). The second is rewritten in place; so that a long title fits, the environment strings
 * that follow the arguments are first copied to the heap (environ then points there), and
 * the arguments and the environment together become the title's room.
 */
#ifndef KVR_BASE_PROCTITLE_H
#define KVR_BASE_PROCTITLE_H

/* Sets the title (printf-style) and a short comm derived from it ("kvr worker 1"). Call
 * only after the command line and the environment have been parsed: argv is overwritten. */
void kvr_proctitle_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
