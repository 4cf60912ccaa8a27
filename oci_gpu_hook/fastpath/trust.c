/* oci-gpu-hook native front, the trust rule, the install's pins, and the hand-over to Python: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/trust.py walk_problem, identity, load_pins, pin_problem (the one trust rule: config.py
 * check_trusted, code_problem; tests/test_trust_rule.py holds them to each other); untrusted: the TRUST check
 * of oci_gpu_hook/install/launchers.py (trust.py code_problem).
 */

/* ------------------------------------------------------------------ hand-over to Python */

/* ------------------------------------------------------------------ the trust rule (oci_gpu_hook/trust.py) */

/* trust.py identity: privileged (the effective uid is the parent namespace's root, or a uid with capabilities in
 * the initial namespace), and the uid the parent's root shows as here when this user namespace does not map it
 * (the kernel's overflow uid), -1 where it is mapped.  Read once. */
static int g_identity_read, g_privileged;
static long g_overflow = -1;

static ssize_t read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n, got = 0;
    if (fd < 0)
        return -1;
    while (got < (ssize_t)size - 1 && (n = read(fd, buf + got, size - 1 - (size_t)got)) > 0)
        got += n;
    close(fd);
    buf[got] = '\0';
    return got;
}

static void read_identity(void)
{
    char map[4096], *line, *save = NULL;
    unsigned long long euid = geteuid(), inside, out, count;
    int ranges = 0, identity_map = 0, root_mapped = 0, host_root = 0;
    if (g_identity_read)
        return;
    g_identity_read = 1;
    if (read_small("/proc/self/uid_map", map, sizeof map) > 0) {
        for (line = strtok_r(map, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char extra;
            if (sscanf(line, " %llu %llu %llu %c", &inside, &out, &count, &extra) != 3)
                continue;
            ranges++;
            identity_map = ranges == 1 && inside == 0 && out == 0 && count == 4294967295ULL;
            if (out == 0 && count > 0)
                root_mapped = 1;
            if (inside <= euid && euid < inside + count && out + euid - inside == 0)
                host_root = 1;
        }
    }
    if (!ranges) { /* no /proc: the initial namespace, as far as this process can tell */
        identity_map = root_mapped = 1;
        host_root = euid == 0;
    }
    g_privileged = host_root;
    if (!g_privileged && identity_map && ranges <= 1) { /* a non-root uid with capabilities over the host */
        char status[8192], *cap;
        if (read_small("/proc/self/status", status, sizeof status) > 0 && (cap = strstr(status, "\nCapEff:")))
            g_privileged = strtoull(cap + 8, NULL, 16) != 0;
    }
    if (!root_mapped) {
        char text[32];
        g_overflow = read_small("/proc/sys/kernel/overflowuid", text, sizeof text) > 0 ? strtol(text, NULL, 10) : 65534;
    }
}

static int owner_trusted(uid_t uid)
{
    read_identity();
    if (uid == 0)
        return 1;
    if (g_privileged)
        return 0;
    return uid == geteuid() || (g_overflow >= 0 && (long)uid == g_overflow);
}

/* trust.load_pins and trust.pin_problem: where the parent's root shows as the overflow uid, the install's own
 * entries that read as that uid must still be the ones install pinned (inode, change time in ns; inode 0: absent),
 * read from the pins file beside the launchers ("INODE CTIME_NS PATH" a line) on first need. */
struct pin {
    unsigned long long ino, ctime;
    const char *path;
};
static struct pin *g_pins;
static size_t g_pin_count;
static int g_pins_read;
static const char *g_pins_path; /* NULL: OGH_PINS_NAME beside OGH_SELF */
static int g_unpinned;           /* a walk met an entry that is no longer what install pinned */
static int g_pins_too_large;     /* trust.TOO_LARGE: the file is over OGH_MAX_PINS bytes, none of it is read */

static void load_pins(void)
{
    static char text[OGH_MAX_PINS + 2];
    char path[PATH_MAX], *line, *save = NULL;
    const char *slash;
    size_t most;
    ssize_t got;
    g_pins_read = 1;
    if (g_overflow < 0)
        return;
    if (g_pins_path) {
        snprintf(path, sizeof path, "%s", g_pins_path);
    } else {
        slash = strrchr(OGH_SELF, '/');
        if (!slash || snprintf(path, sizeof path, "%.*s/%s", (int)(slash - OGH_SELF), OGH_SELF, OGH_PINS_NAME) >=
                          (int)sizeof path)
            return;
    }
    got = read_small(path, text, sizeof text);
    if (got <= 0)
        return;
    if (got > OGH_MAX_PINS) { /* more than trust.MAX_PINS: not read at all, never in part */
        g_pins_too_large = 1;
        return;
    }
    most = 1;
    for (line = text; *line; line++)
        most += *line == '\n';
    g_pins = calloc(most, sizeof *g_pins);
    if (!g_pins)
        return;
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *end, *end2;
        unsigned long long ino, ctime;
        if (!isdigit((unsigned char)line[0]))
            continue;
        ino = strtoull(line, &end, 10);
        if (*end != ' ' || !isdigit((unsigned char)end[1]))
            continue;
        ctime = strtoull(end + 1, &end2, 10);
        if (*end2 != ' ' || end2[1] != '/')
            continue;
        g_pins[g_pin_count].ino = ino;
        g_pins[g_pin_count].ctime = ctime;
        g_pins[g_pin_count++].path = end2 + 1;
    }
}

/* trust.pin_problem is None (``st`` NULL: the path is absent) */
static int pin_kept(const char *path, const struct stat *st)
{
    size_t i;
    read_identity();
    if (g_overflow < 0)
        return 1;
    if (!g_pins_read)
        load_pins();
    if (st && (long)st->st_uid != g_overflow)
        return 1;
    if (g_pins_too_large) {
        g_unpinned = 1;
        return 0;
    }
    for (i = 0; i < g_pin_count; i++) {
        int kept;
        if (strcmp(g_pins[i].path, path) != 0)
            continue;
        if (!st)
            kept = g_pins[i].ino == 0 && g_pins[i].ctime == 0;
        else
            kept = g_pins[i].ino == (unsigned long long)st->st_ino &&
                   g_pins[i].ctime == (unsigned long long)st->st_ctim.tv_sec * 1000000000ULL +
                                          (unsigned long long)st->st_ctim.tv_nsec;
        g_unpinned |= !kept;
        return kept;
    }
    return 1;
}

/* trust.entry_problem: a trusted owner, writable by group or others only when it is a symlink (its mode means
 * nothing), a sticky directory or /dev/null, and still what install pinned */
static int entry_trusted(const char *path, const struct stat *st)
{
    if (!owner_trusted(st->st_uid))
        return 0;
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !S_ISLNK(st->st_mode) &&
        !(S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX)) &&
        !(S_ISCHR(st->st_mode) && major(st->st_rdev) == 1 && minor(st->st_rdev) == 3))
        return 0;
    return pin_kept(path, st);
}

/* the next component of the '/'-separated ``rest`` (skipping empty ones and "."), copied to ``name``; 0 at the end */
static int next_component(const char **rest, char *name, size_t size)
{
    for (;;) {
        const char *p = *rest, *end;
        size_t len;
        while (*p == '/')
            p++;
        if (!*p)
            return 0;
        end = strchr(p, '/');
        len = end ? (size_t)(end - p) : strlen(p);
        *rest = p + len;
        if (len == 1 && p[0] == '.')
            continue;
        if (len >= size)
            return -1;
        memcpy(name, p, len);
        name[len] = '\0';
        return 1;
    }
}

/* trust.walk_problem(path, trusted_owners(), must_exist) is None: walk from / down with lstat, each symlink met
 * followed by hand (its target's components go before the rest), ".." from where the walk is; a missing component
 * (or a non-directory with more to come) ends the walk, trusted unless ``must_exist`` */
static int trusted(const char *path, int must_exist)
{
    char rest[2 * PATH_MAX], current[PATH_MAX], candidate[PATH_MAX], target[PATH_MAX], name[NAME_MAX + 1];
    const char *cursor;
    struct stat st;
    int links = 0, got;
    if (path[0] != '/' || strlen(path) >= sizeof rest)
        return 0;
    strcpy(rest, path);
    strcpy(current, "/");
    if (lstat("/", &st) != 0 || !entry_trusted("/", &st))
        return 0;
    cursor = rest;
    while ((got = next_component(&cursor, name, sizeof name)) == 1) {
        const char *peek;
        char ignored[NAME_MAX + 1];
        if (strcmp(name, "..") == 0) {
            char *slash = strrchr(current, '/');
            slash[slash == current ? 1 : 0] = '\0';
            continue;
        }
        if (snprintf(candidate, sizeof candidate, "%s%s%s", current, strcmp(current, "/") ? "/" : "", name) >=
            (int)sizeof candidate)
            return 0;
        if (lstat(candidate, &st) != 0)
            return errno == ENOENT && pin_kept(candidate, NULL) && !must_exist;
        if (!entry_trusted(candidate, &st))
            return 0;
        if (S_ISLNK(st.st_mode)) {
            char joined[2 * PATH_MAX];
            ssize_t n;
            if (++links > 40)
                return 0;
            n = readlink(candidate, target, sizeof target);
            if (n < 0 || (size_t)n >= sizeof target)
                return 0;
            target[n] = '\0';
            if (target[0] == '/')
                strcpy(current, "/");
            if (snprintf(joined, sizeof joined, "%s/%s", target, cursor) >= (int)sizeof joined)
                return 0;
            strcpy(rest, joined);
            cursor = rest;
            continue;
        }
        peek = cursor;
        if (!S_ISDIR(st.st_mode) && next_component(&peek, ignored, sizeof ignored) != 0)
            return !must_exist; /* opening it fails with ENOTDIR, and says so */
        strcpy(current, candidate);
    }
    return got == 0;
}

#ifdef OGH_TRUST_PROBE
/* A test build only, never a launcher (tests/test_trust_rule.py compiles it with -DOGH_TRUST_PROBE): for each
 * "code PATH" or "config PATH" pair of arguments, one line "trusted" or "untrusted" by the rule above, then the
 * identity it read ("privileged=N overflow=UID"), so the tests hold the C rule to trust.py case by case.  A
 * "pins FILE" pair names the pins file the rule reads, in place of the one beside OGH_SELF. */
int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "pins") == 0)
            g_pins_path = argv[i + 1];
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "pins") != 0)
            printf("%s\n", trusted(argv[i + 1], strcmp(argv[i], "code") == 0) ? "trusted" : "untrusted");
    }
    read_identity();
    printf("privileged=%d overflow=%ld\n", g_privileged, g_overflow);
    return 0;
}
#define main ogh_role_main /* the role's own main below is then an unused function of this test build */
#endif

static void refuse(const char *what, const char *path)
{
    if (g_pins_too_large)
        say_error("refusing to run %s %s: the pins file of `oci-gpu-hook install` is larger than %d bytes, so none "
                  "of it is read and nothing that reads as uid %ld can be vouched for; run install again", what, path,
                  OGH_MAX_PINS, g_overflow);
    else if (g_unpinned)
        say_error("refusing to run %s %s: it, or a directory above it, changed after `oci-gpu-hook install` ran "
                  "(in this user namespace root's files and other users' read alike, as uid %ld, so only what "
                  "install saw is trusted); run install again", what, path, g_overflow);
    else
        say_error("refusing to run %s %s: it is missing, or someone other than %s could change it or a directory "
                  "above it (install into a root-owned prefix, see docs/security.md)", what, path,
                  g_privileged ? "root" : "root or this user");
    _exit(1);
}

/* NULL when the interpreter, the Python launcher and every code path are trusted, else the first that is not */
static const char *untrusted(const char **what)
{
    int i;
    if (!OGH_CHECK_TRUST)
        return NULL;
    g_unpinned = 0;
    *what = "interpreter";
    if (!trusted(OGH_PYTHON, 1))
        return OGH_PYTHON;
    *what = "launcher";
    if (!trusted(OGH_SCRIPT, 1))
        return OGH_SCRIPT;
    *what = "code path";
    for (i = 0; OGH_CODE_PATHS[i]; i++)
        if (!trusted(OGH_CODE_PATHS[i], 1))
            return OGH_CODE_PATHS[i];
    return NULL;
}

static void check_trust(void)
{
    const char *what = "", *path = untrusted(&what);
    if (path)
        refuse(what, path);
}

/* exec the Python launcher with the same argv; ``input`` (when not NULL) becomes its stdin again, followed by
 * what is left of stdin when ``more`` */
static void to_python(const char *input, size_t len, int more)
{
    char **args;
    int i, n = 0;
    check_trust();
    if (g_python_reason)
        to_syslog(OGH_SYSLOG_PRI_INFO, "%s: every create, run and hook starts Python until `oci-gpu-hook launchers` "
                "(or install) is run again; handing over to Python", g_python_reason);
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
            say_error("cannot keep stdin for the Python path: %s", strerror(errno));
            _exit(1);
        }
        while (done < len) {
            ssize_t w = write(fd, input + done, len - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                say_error("cannot keep stdin for the Python path: %s", strerror(errno));
                _exit(1);
            }
            done += (size_t)w;
        }
        while (more) {
            char chunk[65536];
            ssize_t r = read(0, chunk, sizeof chunk), w = 0;
            if (r < 0 && errno == EINTR)
                continue;
            if (r == 0)
                break;
            while (r > 0 && w < r) {
                ssize_t k = write(fd, chunk + w, (size_t)(r - w));
                if (k < 0 && errno == EINTR)
                    continue;
                if (k <= 0)
                    break;
                w += k;
            }
            if (r < 0 || w < r) {
                say_error("cannot keep stdin for the Python path: %s", strerror(errno));
                _exit(1);
            }
        }
        if (lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0) {
            say_error("cannot hand stdin to the Python path: %s", strerror(errno));
            _exit(1);
        }
        if (fd != 0)
            close(fd);
    }
    args = calloc((g_argc > 1 ? (size_t)g_argc - 1 : 0) + 5, sizeof *args);
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
    say_error("cannot run %s: %s", OGH_PYTHON, strerror(errno));
    _exit(1);
}

