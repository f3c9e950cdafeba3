/*
 * compat-hook-probe: which libcuda a container image's own loader takes, and what it says.
 *
 * The cluster validator (`compat-hook cluster validate`, docs/validation.md) runs it inside a
 * workload's image, through compat-hook's RuntimeClass, after a driver change. It loads
 * "libcuda.so.1" the way a CUDA application does (dlopen by SONAME: the image's ld.so.cache,
 * LD_LIBRARY_PATH and whatever compat-hook changed decide), then reports, as one JSON object on
 * stdout and in /dev/termination-log (the pod's termination message):
 *
 *   {"probe": 1, "glibc": "2.35", "libcuda": "<real path of the file the loader mapped>",
 *    "loaded_as": "<the name it was loaded by>", "driver_api": 12040, "driver_api_rc": 0,
 *    "gpu": false, "cuinit": null, "maps": ["<every mapped file named libcuda*>"], "error": null}
 *
 * driver_api is cuDriverGetVersion (12040 = CUDA 12.4). cuInit(0) is called only where a GPU is
 * present (/dev/nvidiactl and a /dev/nvidiaN): elsewhere it would try to create the device nodes.
 * Exit 0 when the object was written (whatever it says), 2 when it could not be.
 *
 * It must start in any glibc image, old ones included: it is linked against the oldest symbol
 * versions (GLIBC_2.2.5 on x86_64: dlopen and friends lived in libdl.so.2 before glibc 2.34, so
 * that is linked too) and, on x86_64, brings its own _start calling the old
 * __libc_start_main@GLIBC_2.2.5 (a new crt1.o asks for GLIBC_2.34). packaging/oci-image/
 * stage-probe.sh builds it and checks that no newer version is needed. No stack protector, no
 * fortify: both add newer symbols.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
__asm__(".symver dladdr,dladdr@GLIBC_2.2.5");
__asm__(".symver memcpy,memcpy@GLIBC_2.2.5");
__asm__(".symver __libc_start_main,__libc_start_main@GLIBC_2.2.5");

/* The process entry: what glibc's start.S does, with the old __libc_start_main. */
__asm__(".text\n"
        ".globl _start\n"
        ".type _start,@function\n"
        "_start:\n"
        "  xorl %ebp, %ebp\n"
        "  movq %rdx, %r9\n"           /* rtld_fini */
        "  popq %rsi\n"                /* argc */
        "  movq %rsp, %rdx\n"          /* argv */
        "  andq $-16, %rsp\n"
        "  pushq %rax\n"
        "  pushq %rsp\n"               /* stack_end */
        "  xorl %r8d, %r8d\n"          /* fini */
        "  xorl %ecx, %ecx\n"          /* init */
        "  movq $main, %rdi\n"
        "  call __libc_start_main\n"
        "  hlt\n");
#endif

typedef int (*cu_int_fn)(int *);
typedef int (*cu_init_fn)(unsigned int);

static char out[16384];
static size_t used;

static void put(const char *s)
{
    size_t n = strlen(s);
    if (used + n < sizeof(out) - 1) {
        memcpy(out + used, s, n);
        used += n;
        out[used] = 0;
    }
}

/* A JSON string (or null) of s: quotes, backslashes and control bytes escaped. */
static void put_str(const char *s)
{
    char esc[8];
    if (s == NULL) {
        put("null");
        return;
    }
    put("\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = 0;
            put(esc);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(esc);
        } else {
            esc[0] = (char)c;
            esc[1] = 0;
            put(esc);
        }
    }
    put("\"");
}

static void put_int(const char *key, int present, int v)
{
    char buf[64];
    put(",\"");
    put(key);
    put("\":");
    if (!present) {
        put("null");
        return;
    }
    snprintf(buf, sizeof buf, "%d", v);
    put(buf);
}

/* /dev/nvidiactl and at least one /dev/nvidiaN: the runtime gave the container a GPU. */
static int gpu_present(void)
{
    DIR *d;
    struct dirent *e;
    int found = 0;
    if (access("/dev/nvidiactl", F_OK) != 0)
        return 0;
    d = opendir("/dev");
    if (d == NULL)
        return 0;
    while (!found && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, "nvidia", 6) == 0 && n[6] >= '0' && n[6] <= '9')
            found = 1;
    }
    closedir(d);
    return found;
}

/* Every mapped file whose name starts with libcuda (two of them would be a broken process). */
static void put_maps(void)
{
    char line[PATH_MAX + 256];
    char seen[4][PATH_MAX];
    int n = 0, i;
    FILE *f = fopen("/proc/self/maps", "r");
    put(",\"maps\":[");
    if (f != NULL) {
        while (n < 4 && fgets(line, sizeof line, f) != NULL) {
            char *path = strchr(line, '/');
            char *base, *nl;
            int dup = 0;
            if (path == NULL)
                continue;
            nl = strchr(path, '\n');
            if (nl)
                *nl = 0;
            base = strrchr(path, '/');
            if (base == NULL || strncmp(base + 1, "libcuda", 7) != 0)
                continue;
            for (i = 0; i < n; i++)
                if (strcmp(seen[i], path) == 0)
                    dup = 1;
            if (dup)
                continue;
            snprintf(seen[n], sizeof seen[n], "%s", path);
            if (n)
                put(",");
            put_str(seen[n]);
            n++;
        }
        fclose(f);
    }
    put("]");
}

static int emit(void)
{
    int fd, ok = 0;
    size_t off = 0;
    put("}\n");
    if (fputs(out, stdout) >= 0 && fflush(stdout) == 0)
        ok = 1;
    fd = open("/dev/termination-log", O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd >= 0) {
        while (off < used) {
            ssize_t w = write(fd, out + off, used - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
    }
    return ok ? 0 : 2;
}

int main(void)
{
    char real[PATH_MAX];
    const char *loaded = NULL, *resolved = NULL, *error = NULL;
    int version = -1, version_rc = -1, have_version = 0, have_rc = 0, gpu, init_rc = -1, have_init = 0;
    void *h;
    Dl_info info;

    put("{\"probe\":1,\"glibc\":");
    put_str(gnu_get_libc_version());
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        error = dlerror();
        if (error == NULL)
            error = "dlopen failed";
    } else {
        cu_int_fn get_version = (cu_int_fn)dlsym(h, "cuDriverGetVersion");
        if (get_version == NULL) {
            error = "no cuDriverGetVersion in the loaded libcuda";
        } else {
            if (dladdr((void *)get_version, &info) != 0 && info.dli_fname != NULL) {
                loaded = info.dli_fname;
                resolved = realpath(loaded, real) != NULL ? real : loaded;
            }
            version_rc = get_version(&version);
            have_rc = 1;
            have_version = version_rc == 0;
        }
    }
    gpu = gpu_present();
    if (h != NULL && gpu) {
        cu_init_fn init = (cu_init_fn)dlsym(h, "cuInit");
        if (init != NULL) {
            init_rc = init(0);
            have_init = 1;
        }
    }
    put(",\"libcuda\":");
    put_str(resolved);
    put(",\"loaded_as\":");
    put_str(loaded);
    put_int("driver_api", have_version, version);
    put_int("driver_api_rc", have_rc, version_rc);
    put(gpu ? ",\"gpu\":true" : ",\"gpu\":false");
    put_int("cuinit", have_init, init_rc);
    put_maps();
    put(",\"error\":");
    put_str(error);
    return emit();
}
