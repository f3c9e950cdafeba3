/*
 * Container probe for the compat-hook test harness.
 *
 * Loads "libcuda.so.1" exactly the way a CUDA application does (dlopen by
 * SONAME, so LD_LIBRARY_PATH and /etc/ld.so.cache decide), asks the loaded
 * library for its CUDA version and reports which file the dynamic loader
 * actually mapped.  It never calls cuInit(): that needs a GPU and, as root,
 * mknod()s /dev/nvidiactl (docs/background.md "The ELF note").
 *
 * With an argument, dlopen()s that name instead (an absolute path as numba's
 * NUMBA_CUDA_DRIVER names one, or "libcuda.so" as numba tries first).
 *
 * Output on success (exit 0), two lines:
 *   cuDriverGetVersion=<int>
 *   libcuda=<realpath of the loaded file>
 * and with PROBE_ID set in the environment a third:
 *   libcuda_id=<st_dev>:<st_ino> of the loaded file (a file bind-mounted over
 *     another keeps the name but is told apart by these)
 * and with PROBE_ALSO=<name>[,<name>...] (the driver's companions, which libcuda
 * dlopen()s by soname; the probe has no RPATH, like libcuda, so the search is the
 * same), after libcuda, one line each, N counting from 0:
 *   alsoN=<name> <realpath of the loaded file> <st_dev>:<st_ino>
 *   alsoN=<name> error <dlerror()>
 * dlopen failure: "dlopen-error=<dlerror()>", exit 3.
 * Other failures: "probe-error=<what>", exit 4 (no symbol) / 5 (CUresult != 0).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef int (*get_version_fn)(int *);

/* Where the loader mapped handle h from: the realpath of its link map's name. */
static const char *mapped(void *h, char *resolved)
{
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL || lm->l_name == NULL)
        return "?";
    return realpath(lm->l_name, resolved) != NULL ? resolved : lm->l_name;
}

static void also(const char *names)
{
    char buf[4096], resolved[PATH_MAX];
    char *save = NULL;
    int i = 0;
    strncpy(buf, names, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *n = strtok_r(buf, ",", &save); n != NULL; n = strtok_r(NULL, ",", &save), i++) {
        void *h = dlopen(n, RTLD_NOW);
        if (h == NULL) {
            const char *e = dlerror();
            printf("also%d=%s error %s\n", i, n, e ? e : "(null)");
            continue;
        }
        const char *where = mapped(h, resolved);
        struct stat st;
        if (stat(where, &st) == 0)
            printf("also%d=%s %s %llu:%llu\n", i, n, where, (unsigned long long)st.st_dev,
                   (unsigned long long)st.st_ino);
        else
            printf("also%d=%s %s ?\n", i, n, where);
    }
}

int main(int argc, char **argv)
{
    void *h = dlopen(argc > 1 ? argv[1] : "libcuda.so.1", RTLD_NOW);
    if (h == NULL) {
        const char *e = dlerror();
        printf("dlopen-error=%s\n", e ? e : "(null)");
        return 3;
    }

    struct link_map *lm = NULL;
    char resolved[PATH_MAX];
    const char *where = "?";
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name != NULL) {
        where = lm->l_name;
        if (realpath(lm->l_name, resolved) != NULL)
            where = resolved;
    }

    get_version_fn fn = (get_version_fn)dlsym(h, "cuDriverGetVersion");
    if (fn == NULL) {
        const char *e = dlerror();
        printf("probe-error=no cuDriverGetVersion: %s\nlibcuda=%s\n", e ? e : "(null)", where);
        return 4;
    }
    int v = -1;
    int rc = fn(&v);
    if (rc != 0) {
        printf("probe-error=cuDriverGetVersion returned %d\nlibcuda=%s\n", rc, where);
        return 5;
    }
    struct stat st;
    printf("cuDriverGetVersion=%d\nlibcuda=%s\n", v, where);
    if (getenv("PROBE_ID") != NULL && stat(where, &st) == 0)
        printf("libcuda_id=%llu:%llu\n", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    if (getenv("PROBE_ALSO") != NULL)
        also(getenv("PROBE_ALSO"));
    fflush(stdout);
    return 0;
}
