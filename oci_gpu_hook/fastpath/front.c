/* oci-gpu-hook native front: the part of a launcher that runs when there is nothing to do.
 *
 * Built by `oci-gpu-hook launchers` / `install` with the system C compiler, once per launcher, with
 * the settings of that install baked in (a generated header, see oci_gpu_hook/host/launchers.py).
 *
 *   shim (OGH_ROLE_SHIM): no argument is "create" or "run"  -> exec the real runtime at once
 *                         (pass-through never reads the config file, never starts Python);
 *                         else every config.json runc could read is scanned -> clean: exec the runtime.
 *   hook (OGH_ROLE_HOOK): "prestart"/"createRuntime": the state on stdin names the bundle, its
 *                         config.json is scanned -> clean: exit 0;
 *                         "precreate": the config on stdin is scanned -> clean: copy it to stdout.
 *
 * "Clean" means CERTAIN that no source the Python path honours can ask for a device: the bytes are
 * valid UTF-8 and valid JSON, contain no backslash-u escape, and contain none of the request variable
 * names of any backend and not "cdi.k8s.io", compared without regard to case.  Anything else, any
 * error, a config file that changed since the launcher was written, an OCI_GPU_HOOK_* variable the
 * fast path cannot vouch for: hand over to the Python launcher with the same argv and the same stdin
 * bytes (a memfd).  Before Python runs, the interpreter and every directory it will load code from
 * must be owned by root and writable by nobody else.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define OGH_ROLE_SHIM 1
#define OGH_ROLE_HOOK 2

#include OGH_BAKED /* OGH_ROLE, OGH_PYTHON, OGH_SCRIPT, OGH_DEFAULTS, OGH_CONFIG_*, OGH_RUNTIME, OGH_NEEDLES, ... */

#define OGH_MAX_INPUT (64L << 20) /* larger inputs go to Python, which reads anything */
#define MAX_DEPTH 400

extern char **environ;

static char **g_argv;
static int g_argc;

/* ------------------------------------------------------------------ hand-over to Python */

static int secure_dir_entry(const char *path, int follow)
{
    struct stat st;
    if ((follow ? stat(path, &st) : lstat(path, &st)) != 0)
        return 0;
    if (st.st_uid != 0)
        return 0;
    if (S_ISLNK(st.st_mode))
        return 1;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX)))
        return 0;
    return 1;
}

/* ``path`` and every directory above it: root's, and writable by no one else (a sticky directory
 * such as /tmp is fine: its root-owned entries cannot be replaced).  Checked as written and as resolved. */
static int trusted_path(const char *path)
{
    char buf[PATH_MAX], real[PATH_MAX];
    int pass;
    if (path[0] != '/' || strlen(path) >= sizeof buf || !realpath(path, real))
        return 0;
    for (pass = 0; pass < 2; pass++) {
        char *slash;
        strcpy(buf, pass ? real : path);
        for (;;) {
            if (!secure_dir_entry(buf[0] ? buf : "/", pass))
                return 0;
            if (!buf[0] || strcmp(buf, "/") == 0)
                break;
            slash = strrchr(buf, '/');
            *slash = '\0';
        }
    }
    return 1;
}

static void refuse(const char *what, const char *path)
{
    dprintf(2, "oci-gpu-hook: error: refusing to run: %s %s is missing or writable by a non-root user "
               "(install into a root-owned prefix, see README)\n", what, path);
    _exit(1);
}

/* NULL when the interpreter, the Python launcher and every code path are trusted, else the first that is not */
static const char *untrusted(const char **what)
{
    int i;
    if (!OGH_CHECK_TRUST)
        return NULL;
    *what = "interpreter";
    if (!trusted_path(OGH_PYTHON))
        return OGH_PYTHON;
    *what = "launcher";
    if (!trusted_path(OGH_SCRIPT))
        return OGH_SCRIPT;
    *what = "code path";
    for (i = 0; OGH_CODE_PATHS[i]; i++)
        if (!trusted_path(OGH_CODE_PATHS[i]))
            return OGH_CODE_PATHS[i];
    return NULL;
}

static void check_trust(void)
{
    const char *what = "", *path = untrusted(&what);
    if (path)
        refuse(what, path);
}

/* exec the Python launcher with the same argv; ``input`` (when not NULL) becomes its stdin again */
static void to_python(const char *input, size_t len)
{
    char **args;
    int i, n = 0;
    check_trust();
    if (input) {
        int fd = memfd_create("oci-gpu-hook-stdin", 0);
        size_t done = 0;
        if (fd < 0) {
            char name[] = "/tmp/oci-gpu-hook-stdin-XXXXXX";
            fd = mkstemp(name);
            if (fd >= 0)
                unlink(name);
        }
        if (fd < 0) {
            dprintf(2, "oci-gpu-hook: error: cannot keep stdin for the Python path: %s\n", strerror(errno));
            _exit(1);
        }
        while (done < len) {
            ssize_t w = write(fd, input + done, len - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                dprintf(2, "oci-gpu-hook: error: cannot keep stdin for the Python path: %s\n", strerror(errno));
                _exit(1);
            }
            done += (size_t)w;
        }
        if (lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0) {
            dprintf(2, "oci-gpu-hook: error: cannot hand stdin to the Python path: %s\n", strerror(errno));
            _exit(1);
        }
        if (fd != 0)
            close(fd);
    }
    args = calloc((size_t)g_argc + 5, sizeof *args);
    if (!args)
        _exit(1);
    args[n++] = (char *)OGH_PYTHON;
    args[n++] = "-I";
    args[n++] = "-S";
    args[n++] = (char *)OGH_SCRIPT;
    for (i = 1; i < g_argc; i++)
        args[n++] = g_argv[i];
    args[n] = NULL;
    execv(OGH_PYTHON, args);
    dprintf(2, "oci-gpu-hook: error: cannot run %s: %s\n", OGH_PYTHON, strerror(errno));
    _exit(1);
}

/* ------------------------------------------------------------------ reading */

/* 1 with the whole of fd in *out, 0 when it is too large or unreadable */
static int read_fd(int fd, char **out, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return 0;
    for (;;) {
        ssize_t r;
        if (n == cap) {
            char *bigger;
            if (cap >= (size_t)OGH_MAX_INPUT) {
                free(buf);
                return 0;
            }
            cap *= 2;
            bigger = realloc(buf, cap + 1);
            if (!bigger) {
                free(buf);
                return 0;
            }
            buf = bigger;
        }
        r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return 0;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 1;
}

static int read_path(const char *path, char **out, size_t *len)
{
    struct stat st;
    int ok, fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > OGH_MAX_INPUT) {
        close(fd);
        return 0;
    }
    ok = read_fd(fd, out, len);
    close(fd);
    return ok;
}

/* ------------------------------------------------------------------ checking */

/* strict UTF-8 as Python's decoder: no overlong forms, no surrogates, nothing above U+10FFFF */
static int utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need;
        unsigned int cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + need >= n)
            return 0;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += need + 1;
    }
    return 1;
}

/* A strict JSON reader (RFC 8259, as Python's json with strict=True and no NaN/Infinity) that only
 * validates, and notes the top-level members the hook needs from the state. */
struct json {
    const char *s;
    size_t n, i;
    int depth;
    const char *id, *bundle, *pid; /* spans of the top-level values, when want_state */
    size_t id_len, bundle_len, pid_len;
    int want_state;
};

static void ws(struct json *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

static int hexd(char c)
{
    return isxdigit((unsigned char)c);
}

/* a string at j->i; its raw contents' span (between the quotes) in start and len */
static int jstring(struct json *j, const char **start, size_t *len)
{
    if (j->i >= j->n || j->s[j->i] != '"')
        return 0;
    j->i++;
    *start = j->s + j->i;
    while (j->i < j->n) {
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            *len = (size_t)(j->s + j->i - *start);
            j->i++;
            return 1;
        }
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            char e;
            if (j->i + 1 >= j->n)
                return 0;
            e = j->s[j->i + 1];
            if (e == 'u') {
                if (j->i + 5 >= j->n || !hexd(j->s[j->i + 2]) || !hexd(j->s[j->i + 3]) || !hexd(j->s[j->i + 4]) ||
                    !hexd(j->s[j->i + 5]))
                    return 0;
                j->i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == '\0')
                return 0;
            j->i += 2;
            continue;
        }
        j->i++;
    }
    return 0;
}

static int jnumber(struct json *j)
{
    size_t start = j->i;
    if (j->i < j->n && j->s[j->i] == '-')
        j->i++;
    if (j->i >= j->n || !isdigit((unsigned char)j->s[j->i]))
        return 0;
    if (j->s[j->i] == '0')
        j->i++;
    else
        while (j->i < j->n && isdigit((unsigned char)j->s[j->i]))
            j->i++;
    if (j->i < j->n && j->s[j->i] == '.') {
        j->i++;
        if (j->i >= j->n || !isdigit((unsigned char)j->s[j->i]))
            return 0;
        while (j->i < j->n && isdigit((unsigned char)j->s[j->i]))
            j->i++;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            j->i++;
        if (j->i >= j->n || !isdigit((unsigned char)j->s[j->i]))
            return 0;
        while (j->i < j->n && isdigit((unsigned char)j->s[j->i]))
            j->i++;
    }
    return j->i > start;
}

static int jvalue(struct json *j);

static int jliteral(struct json *j, const char *word)
{
    size_t k = strlen(word);
    if (j->n - j->i < k || memcmp(j->s + j->i, word, k) != 0)
        return 0;
    j->i += k;
    return 1;
}

static int jcontainer(struct json *j, char open)
{
    char close = open == '{' ? '}' : ']';
    int top = j->depth == 0 && open == '{';
    if (++j->depth > MAX_DEPTH)
        return 0;
    j->i++;
    ws(j);
    if (j->i < j->n && j->s[j->i] == close) {
        j->i++;
        j->depth--;
        return 1;
    }
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0, vstart;
        ws(j);
        if (open == '{') {
            if (!jstring(j, &key, &key_len))
                return 0;
            ws(j);
            if (j->i >= j->n || j->s[j->i] != ':')
                return 0;
            j->i++;
            ws(j);
        }
        vstart = j->i;
        if (!jvalue(j))
            return 0;
        if (top && j->want_state) {
            const char *v = j->s + vstart;
            size_t vlen = j->i - vstart;
            /* the last of duplicate keys wins, as in Python */
            if (key_len == 2 && memcmp(key, "id", 2) == 0) {
                j->id = v;
                j->id_len = vlen;
            } else if (key_len == 3 && memcmp(key, "pid", 3) == 0) {
                j->pid = v;
                j->pid_len = vlen;
            } else if (key_len == 6 && memcmp(key, "bundle", 6) == 0) {
                j->bundle = v;
                j->bundle_len = vlen;
            }
        }
        ws(j);
        if (j->i >= j->n)
            return 0;
        if (j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->s[j->i] == close) {
            j->i++;
            j->depth--;
            return 1;
        }
        return 0;
    }
}

static int jvalue(struct json *j)
{
    const char *s;
    size_t len;
    ws(j);
    if (j->i >= j->n)
        return 0;
    switch (j->s[j->i]) {
    case '{':
    case '[':
        return jcontainer(j, j->s[j->i]);
    case '"':
        return jstring(j, &s, &len);
    case 't':
        return jliteral(j, "true");
    case 'f':
        return jliteral(j, "false");
    case 'n':
        return jliteral(j, "null");
    default:
        return jnumber(j);
    }
}

/* 1: valid UTF-8, one JSON object and nothing else */
static int json_object_ok(struct json *j)
{
    if (!utf8_ok((const unsigned char *)j->s, j->n))
        return 0;
    ws(j);
    if (j->i >= j->n || j->s[j->i] != '{' || !jvalue(j))
        return 0;
    ws(j);
    return j->i == j->n;
}

/* 1 only when no byte sequence in ``s`` could make a request: see the comment at the top */
static int clean(const char *s, size_t n)
{
    char *lower;
    int i, ok = 1;
    if (memchr(s, '\\', n)) {
        const char *p = s, *end = s + n;
        while ((p = memchr(p, '\\', (size_t)(end - p))) != NULL) {
            if (p + 1 < end && (p[1] == 'u' || p[1] == 'U'))
                return 0;
            p++;
        }
    }
    lower = malloc(n + 1);
    if (!lower)
        return 0;
    for (size_t k = 0; k < n; k++)
        lower[k] = (char)tolower((unsigned char)s[k]);
    for (i = 0; OGH_NEEDLES[i]; i++) {
        if (memmem(lower, n, OGH_NEEDLES[i], strlen(OGH_NEEDLES[i]))) {
            ok = 0;
            break;
        }
    }
    free(lower);
    return ok;
}

static int spec_clean(const char *s, size_t n)
{
    struct json j = {s, n, 0, 0, NULL, NULL, NULL, 0, 0, 0, 0};
    return json_object_ok(&j) && clean(s, n);
}

/* ``missing_ok``: a config.json that does not exist counts as clean (the shim: a runtime given that bundle
 * fails before any container exists, so nothing can be granted through it) */
static int file_clean(const char *path, int missing_ok)
{
    char *buf;
    size_t len;
    int ok;
    if (!read_path(path, &buf, &len))
        return missing_ok && access(path, F_OK) != 0 && (errno == ENOENT || errno == ENOTDIR);
    ok = spec_clean(buf, len);
    free(buf);
    return ok;
}

/* ------------------------------------------------------------------ settings */

static int bool_ok(const char *v)
{
    static const char *const words[] = {"1", "true", "yes", "on", "0", "false", "no", "off", "", NULL};
    for (int i = 0; words[i]; i++)
        if (strcasecmp(v, words[i]) == 0)
            return 1;
    return 0;
}

/* The baked defaults, as the Python launcher's os.environ.setdefault; then 1 when the settings are
 * still the ones baked in: the same config file, unchanged, and no OCI_GPU_HOOK_* value that
 * Python would reject.  (Values that only narrow what is granted, or say where to log, do not matter
 * to a container that asks for nothing.) */
static int settings_as_baked(void)
{
    struct stat st;
    const char *path, *v;
    for (int i = 0; OGH_DEFAULTS[i]; i += 2)
        setenv(OGH_DEFAULTS[i], OGH_DEFAULTS[i + 1], 0);
    if (!OGH_FAST)
        return 0;
    v = getenv("OCI_GPU_HOOK_DEBUG");
    if (v && !bool_ok(v))
        return 0;
    v = getenv("OCI_GPU_HOOK_ALLOW_ENV_REQUESTS");
    if (v && !bool_ok(v))
        return 0;
    path = getenv("OCI_GPU_HOOK_CONFIG");
    if (path && !path[0])
        path = NULL;
    if (strcmp(path ? path : OGH_DEFAULT_CONFIG, OGH_CONFIG_PATH) != 0)
        return 0;
    if (stat(OGH_CONFIG_PATH, &st) != 0) {
        /* as Python: a missing default file is no file; a named one that is missing is an error */
        return !OGH_CONFIG_EXISTS && errno == ENOENT && !path;
    }
    return OGH_CONFIG_EXISTS && st.st_dev == (dev_t)OGH_CONFIG_DEV && st.st_ino == (ino_t)OGH_CONFIG_INO &&
           st.st_size == (off_t)OGH_CONFIG_SIZE && st.st_mtim.tv_sec == OGH_CONFIG_MTIME_S &&
           st.st_mtim.tv_nsec == OGH_CONFIG_MTIME_NS && st.st_ctim.tv_sec == OGH_CONFIG_CTIME_S &&
           st.st_ctim.tv_nsec == OGH_CONFIG_CTIME_NS && st.st_mode == (mode_t)OGH_CONFIG_MODE &&
           st.st_uid == (uid_t)OGH_CONFIG_UID;
}

/* ------------------------------------------------------------------ the shim */

#if OGH_ROLE == OGH_ROLE_SHIM
static char g_runtime[PATH_MAX];

/* resolve_runtime() of oci_gpu_hook/entry/runtime.py: a name with a slash as it is, else the first
 * executable non-directory on PATH; never this front or its Python launcher. */
static int find_runtime(const char *name)
{
    struct stat st;
    char me[PATH_MAX], real[PATH_MAX], script[PATH_MAX];
    if (!name || !name[0])
        return 0;
    if (strchr(name, '/')) {
        if (strlen(name) >= sizeof g_runtime)
            return 0;
        strcpy(g_runtime, name);
    } else {
        const char *search = getenv("PATH");
        const char *p;
        int found = 0;
        if (!search || !search[0])
            search = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        p = search;
        while (!found) {
            const char *colon = strchr(p, ':');
            size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
            int w = dlen ? snprintf(g_runtime, sizeof g_runtime, "%.*s/%s", (int)dlen, p, name)
                         : snprintf(g_runtime, sizeof g_runtime, "./%s", name);
            if (w > 0 && (size_t)w < sizeof g_runtime && access(g_runtime, X_OK) == 0 &&
                !(stat(g_runtime, &st) == 0 && S_ISDIR(st.st_mode)))
                found = 1;
            if (!colon)
                break;
            p = colon + 1;
        }
        if (!found)
            return 0;
    }
    if (access(g_runtime, X_OK) != 0 || !realpath(g_runtime, real))
        return 0;
    if (realpath("/proc/self/exe", me) && strcmp(me, real) == 0)
        return 0;
    if (realpath(OGH_SCRIPT, script) && strcmp(script, real) == 0)
        return 0;
    return 1;
}

static void exec_runtime(void)
{
    char **args = calloc((size_t)g_argc + 1, sizeof *args);
    if (!args)
        _exit(1);
    args[0] = g_runtime;
    for (int i = 1; i < g_argc; i++)
        args[i] = g_argv[i];
    execv(g_runtime, args);
    dprintf(2, "oci-gpu-hook: error: cannot run %s: %s\n", g_runtime, strerror(errno));
    _exit(1);
}

static int is_bundle_flag(const char *arg, const char **value)
{
    const char *name = arg;
    size_t len;
    const char *eq;
    if (name[0] != '-')
        return 0;
    name += name[1] == '-' ? 2 : 1;
    eq = strchr(name, '=');
    len = eq ? (size_t)(eq - name) : strlen(name);
    if (!((len == 1 && name[0] == 'b') || (len == 6 && memcmp(name, "bundle", 6) == 0)))
        return 0;
    *value = eq ? eq + 1 : NULL;
    return 1;
}

/* every config.json runc could take for this create/run: the working directory's and that of each
 * value that follows a bundle flag, wherever it stands (a misread argv only adds files to scan) */
static int bundles_clean(void)
{
    char path[PATH_MAX];
    if (!file_clean("config.json", 1))
        return 0;
    for (int i = 1; i < g_argc; i++) {
        const char *value = NULL;
        if (!is_bundle_flag(g_argv[i], &value))
            continue;
        if (!value) {
            if (i + 1 >= g_argc)
                return 0;
            value = g_argv[i + 1];
        }
        if (!value[0])
            continue; /* an empty bundle is the working directory, scanned above */
        if (snprintf(path, sizeof path, "%s%sconfig.json", value,
                     value[strlen(value) - 1] == '/' ? "" : "/") >= (int)sizeof path)
            return 0;
        if (!file_clean(path, 1))
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    int as_baked, rewrite = 0;
    const char *name;
    g_argc = argc;
    g_argv = argv;
    as_baked = settings_as_baked();
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "create") == 0 || strcmp(argv[i], "run") == 0)
            rewrite = 1;
    name = getenv("OCI_GPU_HOOK_RUNTIME");
    if (!name || !name[0])
        name = as_baked ? OGH_RUNTIME : NULL;
    if (!rewrite) {
        /* pass-through: the config file is not read here; a runtime named in it is used while the file
         * is as it was baked, else Python decides (it falls back to runc when the file is broken) */
        if (!name || !find_runtime(name)) {
            const char *what = "";
            /* Python cannot be trusted here: the runtime of the install still gets the command */
            if (untrusted(&what) && find_runtime(OGH_RUNTIME))
                exec_runtime();
            to_python(NULL, 0);
        }
        if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-v") == 0)) {
            dprintf(1, "%s\n", OGH_VERSION_LINE);
        }
        exec_runtime();
    }
    if (as_baked && find_runtime(name) && bundles_clean())
        exec_runtime();
    to_python(NULL, 0);
    return 1;
}
#endif

/* ------------------------------------------------------------------ the hooks */

#if OGH_ROLE == OGH_ROLE_HOOK
static int write_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return 0;
        s += w;
        n -= (size_t)w;
    }
    return 1;
}

/* the state's id, pid and bundle as Python's parse_state accepts them, and the bundle's config.json clean */
static int state_clean(const char *s, size_t n)
{
    struct json j = {s, n, 0, 0, NULL, NULL, NULL, 0, 0, 0, 1};
    char path[PATH_MAX];
    if (memchr(s, '\\', n) || !json_object_ok(&j))
        return 0;
    if (!j.id || j.id_len < 3 || j.id[0] != '"')
        return 0;
    if (!j.pid || j.pid_len < 1 || j.pid_len > 9 || j.pid[0] < '1' || j.pid[0] > '9')
        return 0;
    for (size_t k = 0; k < j.pid_len; k++)
        if (!isdigit((unsigned char)j.pid[k]))
            return 0;
    if (!j.bundle || j.bundle_len < 3 || j.bundle[0] != '"' || j.bundle[1] != '/')
        return 0;
    if (j.bundle_len - 2 + sizeof "/config.json" > sizeof path)
        return 0;
    memcpy(path, j.bundle + 1, j.bundle_len - 2);
    path[j.bundle_len - 2] = '\0';
    if (memchr(path, '\0', j.bundle_len - 2) != NULL && strlen(path) != j.bundle_len - 2)
        return 0;
    strcat(path, path[strlen(path) - 1] == '/' ? "config.json" : "/config.json");
    return file_clean(path, 0);
}

int main(int argc, char **argv)
{
    char *input = NULL;
    size_t len = 0;
    int as_baked;
    g_argc = argc;
    g_argv = argv;
    as_baked = settings_as_baked();
    if (argc != 2 || !as_baked ||
        (strcmp(argv[1], "prestart") != 0 && strcmp(argv[1], "createRuntime") != 0 &&
         strcmp(argv[1], "precreate") != 0))
        to_python(NULL, 0);
    if (chdir("/") != 0)
        to_python(NULL, 0);
    if (!read_fd(0, &input, &len)) {
        dprintf(2, "oci-gpu-hook: error: cannot read stdin (or it is larger than %ld bytes)\n", OGH_MAX_INPUT);
        return 1;
    }
    if (strcmp(argv[1], "precreate") == 0) {
        if (spec_clean(input, len))
            return write_all(1, input, len) ? 0 : 1;
    } else if (state_clean(input, len)) {
        return 0;
    }
    to_python(input, len);
    return 1;
}
#endif
