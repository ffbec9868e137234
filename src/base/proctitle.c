/* proctitle.c — see proctitle.h. */
#include "base/proctitle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

extern char **environ;

static char *title_area; /* argv[0] .. the end of the last contiguous environment string */
static size_t title_room;

/*
 * argv[0] .. argv[argc-1] and then the environment strings sit back to back at the top of
 * the stack; glibc's program_invocation_name is argv[0]. The room is measured up to the end
 * of the last string that follows without a gap, so nothing else is ever overwritten.
 */
static void init_area(void)
{
    char *start = program_invocation_name, *end;
    size_t n = 0;

    if (title_area != NULL || start == NULL)
        return;
    end = start + strlen(start) + 1;
    /* the remaining arguments: contiguous strings up to the first environment string */
    while (environ[0] != NULL && end < environ[0] && end[0] != '\0')
        end += strlen(end) + 1;
    for (n = 0; environ[n] != NULL; n++)
        ;
    if (n > 0 && end == environ[0]) {
        char **copy = malloc((n + 1) * sizeof(*copy));
        if (copy != NULL) {
            size_t i;
            for (i = 0; i < n && environ[i] == end; i++) {
                copy[i] = strdup(environ[i]);
                if (copy[i] == NULL)
                    break;
                end += strlen(environ[i]) + 1;
            }
            if (i == n) {
                copy[n] = NULL;
                environ = copy; /* kept for the life of the process */
            } else {            /* out of memory or a gap: keep the environment where it is */
                while (i > 0)
                    free(copy[--i]);
                free(copy);
                end = environ[0];
            }
        }
    }
    title_area = start;
    title_room = (size_t)(end - start);
}

void kvr_proctitle_set(const char *fmt, ...)
{
    char title[256], comm[16];
    const char *tail;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(title, sizeof(title), fmt, ap);
    va_end(ap);
    /* comm: "kvrelay: worker 1" -> "kvr worker 1" (comm holds 15 bytes) */
    tail = strncmp(title, "kvrelay: ", 9) == 0 ? title + 9 : title;
    {
        size_t n = strlen(tail) < sizeof(comm) - 5 ? strlen(tail) : sizeof(comm) - 5;
        memcpy(comm, "kvr ", 4);
        memcpy(comm + 4, tail, n);
        comm[4 + n] = '\0';
    }
    prctl(PR_SET_NAME, comm, 0, 0, 0);
    init_area();
    if (title_area == NULL || title_room < 2)
        return;
    memset(title_area, 0, title_room);
    memcpy(title_area, title, strlen(title) < title_room - 1 ? strlen(title) : title_room - 1);
}
