/* oci-gpu-hook native front: the part of a launcher that runs without Python.
 *
 * Built by `oci-gpu-hook launchers` / `install` with the system C compiler, once per launcher, with
 * the settings of that install baked in (a generated header, see oci_gpu_hook/host/launchers.py).
 *
 *   shim (OGH_ROLE_SHIM): no argument is "create" or "run"  -> exec the real runtime at once
 *                         (pass-through only compares the config file with the bytes baked, never starts Python);
 *                         else a command line in the common form, whose config.json is clean: exec the runtime.
 *   hook (OGH_ROLE_HOOK): "prestart"/"createRuntime": the state on stdin names the bundle, its
 *                         config.json is scanned -> clean: exit 0;
 *                         "precreate": the config on stdin is scanned -> clean: copy it to stdout;
 *                         "links PATH=TARGET...": the /dev/dri/by-path links made in the container (below);
 *                         "ldcache ...": the resident planner, with its arguments, then Python (ldcache_main).
 *   Anything else (a container that asks for a GPU, say): the resident planner is asked first (`oci-gpu-hook
 *   serve`, see ask_planner), then the Python launcher.
 *
 * One outcome per config, whatever the launcher: the front only ever does what the Python path would do, and
 * where it cannot be certain of that it hands over to the Python launcher with the same argv and the same stdin
 * bytes (a memfd).  "Clean" means CERTAIN that the Python path reads the text without objection and that no
 * source it honours asks for a device: the bytes are valid UTF-8 and one valid JSON object; no object repeats a
 * key, even in another ASCII case; no key holds an escape or a non-ASCII byte, or spells a config.json field in
 * another case; no number is too large for Python's reading; nesting stays shallow; process, process.env and
 * annotations have the types Python reads; there is no backslash-u escape; and none of the request variable
 * names of any backend nor "cdi.k8s.io" occurs, compared without regard to case, outside the process.env entries
 * that certainly ask for nothing: NAME=VALUE with NAME exactly a request name and VALUE, without its spaces and
 * in any ASCII case, a word of request.py NO_GPU ("AMD_VISIBLE_DEVICES=", "...=none"; no escape, ASCII only: then
 * Python's strip and lower do no more).  Such an entry leaves that name without a request (environ_of: the last
 * entry wins, and any other entry naming it is not set aside and hands over; past MAX_MASKED such entries the
 * rest are not set aside either).  Anything else, any error, a
 * config file that is not byte for byte the one the launcher was baked from, an OCI_GPU_HOOK_* variable the
 * fast path cannot vouch for: hand over.  Before Python runs, the interpreter and every directory it will
 * load code from must pass the trust rule of oci_gpu_hook/trust.py (root's alone for a privileged front; a
 * rootless one also takes what only its user, or root as its user namespace shows root, could change).
 *
 * The fast-path contract -- every name and word the front compares that Python defines -- is not spelled here:
 * oci_gpu_hook/host/launchers.py front_contract takes each from where Python defines it and bakes it as OGH_<KEY>
 * (the bool words and variables, the config and runtime variables, the rewrite and hook commands, the links
 * command, its directory and node names, the default PATH, the planner's socket, variable and bound); the
 * request names and "cdi.k8s.io" are OGH_NEEDLES and the request names as spelled OGH_REQUEST_NAMES (launchers.py
 * baked_settings), the words that ask for nothing OGH_NO_REQUEST_WORDS (front_contract, from request.py NO_GPU),
 * the config.json field names OGH_FIELD_NAMES (oci_spec.py _FIELDS), the planner's version line
 * OGH_PLANNER_VERSION (planner/protocol.py version_line).
 *
 * The Python each part mirrors:
 *   settings_as_baked   oci_gpu_hook/config.py load_config (env values: check_value of the bool fields),
 *                       the launcher's os.environ.setdefault of the baked defaults,
 *                       oci_gpu_hook/host/launchers.py baked_settings (the config bytes baked)
 *   trusted, read_identity  oci_gpu_hook/trust.py walk_problem, identity (the one trust rule: config.py
 *                       check_trusted, code_problem; tests/test_trust_rule.py holds them to each other)
 *   load_pins, pin_kept oci_gpu_hook/trust.py load_pins, pin_problem (the install's pins, rootless only)
 *   json_object_ok      oci_gpu_hook/fastjson.py loads, oci_gpu_hook/oci_spec.py loads (_pairs, _check_case),
 *                       oci_spec.py ContainerSpec (process_env, annotations)
 *   clean, no_request   oci_gpu_hook/request.py requested (NO_GPU; oci_spec.py environ_of, annotation_names)
 *   read_state          oci_gpu_hook/oci_state.py parse_state
 *   state_clean         read_state, then live.py run's read of BUNDLE/config.json
 *   precreate           oci_gpu_hook/entry/cli.py cmd_precreate
 *   links_main          oci_gpu_hook/appliers/live.py run_links (entry/cli.py main: split_globals, chdir)
 *   ldcache_main        oci_gpu_hook/appliers/live.py run_ldcache (served by the planner, else Python)
 *   link_ok             oci_gpu_hook/core/edits.py check_link
 *   root_path           oci_gpu_hook/oci_spec.py ContainerSpec.root (os.path.normpath of os.path.join)
 *   container_ok        oci_gpu_hook/appliers/live.py check_container (and what apply_in_container's setns needs)
 *   make_links          oci_gpu_hook/appliers/rootfs.py make_nodes for links (_walk, _make_symlink),
 *                       entered through /proc/PID/root with openat2 where Python enters by setns
 *   in_root, dir_beneath  oci_gpu_hook/core/inroot.py open_dir, FOLLOW and REFUSE (tests/test_inroot.py)
 *   find_runtime        oci_gpu_hook/entry/runtime.py resolve_runtime
 *   common_config_path  oci_gpu_hook/oci_argv.py parse_argv and config_path, for runc and for crun
 *   ask_planner         oci_gpu_hook/host/planner/protocol.py read_request, encode_answer (the protocol),
 *                       planner/worker.py run_entry
 *                       (what the answer holds); exec_path: entry/runtime.py main's execv (after prepare)
 *   untrusted           the TRUST check of oci_gpu_hook/host/launchers.py (trust.py code_problem)
 *   to_syslog           oci_gpu_hook/log.py to_syslog (syslog_message, syslog_text), with the config's syslog as baked
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
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#define OGH_ROLE_SHIM 1
#define OGH_ROLE_HOOK 2

#include OGH_BAKED /* OGH_ROLE, OGH_PYTHON, OGH_SCRIPT, OGH_DEFAULTS, OGH_CONFIG_*, OGH_RUNTIME, OGH_NEEDLES, ... */

#define OGH_MAX_INPUT (64L << 20) /* larger inputs go to Python, which reads anything */
#define OGH_PLANNER_MAX_ANSWER (256L << 20)

extern char **environ;

static char **g_argv;
static int g_argc;
static const char *g_slow; /* why every container goes to Python (settings_as_baked), for the journal's line */
static char g_container[129]; /* the container the input names (the shim's argv, the state's id), for the journal */

/* log.py to_syslog's ``container``: the first 128 bytes of the name the input gives */
static void note_container(const char *name, size_t n)
{
    if (n >= sizeof g_container)
        n = sizeof g_container - 1;
    memcpy(g_container, name, n);
    g_container[n] = '\0';
}

/* ------------------------------------------------------------------ the journal's line */

/* The journal's MESSAGE, escaped and cut.  The reference is oci_gpu_hook/log.py syslog_text (its docstring states
 * the rule; tests/test_journal.py holds this code to it byte for byte on one corpus): printable ASCII and every
 * well-formed UTF-8 sequence of a character from U+00A0 up are kept; every other byte is "\xNN" (controls, DEL,
 * a C1 control's UTF-8, each byte of an ill-formed sequence); nothing is folded; at most OGH_SYSLOG_MAX bytes of
 * whole pieces, then "...".  ``raw``: the message's first ``n`` bytes, n at most OGH_SYSLOG_MAX + 4 (what follows
 * is cut anyway); ``out``: OGH_SYSLOG_MAX + 3 bytes. */
static size_t utf8_length(const unsigned char *s, size_t n)
{
    unsigned char lo = 0x80, hi = 0xbf;
    size_t len;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        len = 2;
        if (s[0] == 0xc2)
            lo = 0xa0; /* U+0080..U+009F: the C1 controls, escaped */
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        len = 3;
        if (s[0] == 0xe0)
            lo = 0xa0; /* overlong */
        else if (s[0] == 0xed)
            hi = 0x9f; /* a surrogate */
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        len = 4;
        if (s[0] == 0xf0)
            lo = 0x90; /* overlong */
        else if (s[0] == 0xf4)
            hi = 0x8f; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

static size_t syslog_text(char *out, const char *raw, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t size = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *s = (const unsigned char *)raw + i;
        size_t len = s[0] >= 0x20 && s[0] <= 0x7e ? 1 : utf8_length(s, n - i);
        char piece[4] = {'\\', 'x', hex[s[0] >> 4], hex[s[0] & 15]};
        size_t width = len ? len : sizeof piece;
        if (size + width > OGH_SYSLOG_MAX) {
            memcpy(out + size, "...", 3);
            return size + 3;
        }
        memcpy(out + size, len ? (const char *)s : piece, width);
        size += width;
        i += len ? len : 1;
    }
    return size;
}

/* MESSAGE before syslog_text, as log.py syslog_message builds it: "ENTRY: container ID: TEXT" ("ENTRY: TEXT"
 * without one), its first OGH_SYSLOG_MAX + 4 bytes. */
static size_t syslog_raw(char *raw, size_t size, const char *entry, const char *text)
{
    int n = snprintf(raw, size, "%s: %s%s%s%s", entry, g_container[0] ? "container " : "", g_container,
                     g_container[0] ? ": " : "", text);
    return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

/* oci_gpu_hook/log.py to_syslog: "<PRI>Mmm dd hh:mm:ss oci-gpu-hook[PID]: MESSAGE" as one datagram to the syslog
 * socket, non-blocking; nothing when it cannot go, nor when the config baked says syslog = false.  ENTRY: the
 * hook's command or the shim's name, as Python writes it. */
static void to_syslog(int pri, const char *fmt, ...)
{
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char text[OGH_SYSLOG_MAX + 5], raw[OGH_SYSLOG_MAX + 5], line[OGH_SYSLOG_MAX + 128];
    struct tm tm;
    time_t now = time(NULL);
    va_list ap;
    int n, fd;
    size_t length;
    if (!OGH_SYSLOG || strlen(OGH_SYSLOG_SOCKET) >= sizeof addr.sun_path || !localtime_r(&now, &tm))
        return;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    n = snprintf(line, sizeof line, "<%d>%s %2d %02d:%02d:%02d %s[%ld]: ", pri, months[tm.tm_mon], tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec, OGH_PROGRAM, (long)getpid());
    if (n <= 0 || (size_t)n >= sizeof line - (OGH_SYSLOG_MAX + 3))
        return;
    length = syslog_raw(raw, sizeof raw, OGH_ROLE == OGH_ROLE_SHIM || g_argc < 2 ? OGH_ROLE_NAME : g_argv[1], text);
    length = (size_t)n + syslog_text(line + n, raw, length);
    strcpy(addr.sun_path, OGH_SYSLOG_SOCKET);
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    sendto(fd, line, length, MSG_NOSIGNAL, (struct sockaddr *)&addr, sizeof addr);
    close(fd);
}

#ifdef OGH_SYSLOG_PROBE
/* A test build only, never a launcher (tests/test_journal.py compiles it with -DOGH_SYSLOG_PROBE): for each
 * "ENTRY CONTAINER TEXT" triple of arguments, MESSAGE as to_syslog() sends it, then a newline (MESSAGE never holds
 * one), so the tests hold this code to log.py syslog_text byte for byte. */
int main(int argc, char **argv)
{
    static char raw[OGH_SYSLOG_MAX + 5], out[OGH_SYSLOG_MAX + 4];
    for (int i = 1; i + 2 < argc; i += 3) {
        size_t n;
        note_container(argv[i + 1], strlen(argv[i + 1]));
        n = syslog_text(out, raw, syslog_raw(raw, sizeof raw, argv[i], argv[i + 2]));
        out[n] = '\n';
        fwrite(out, 1, n + 1, stdout);
    }
    return 0;
}
#define main ogh_role_main /* the role's own main below is then an unused function of this test build */
#endif

/* the one error line on stderr, and the journal's (a front refuses by itself only where Python cannot run) */
static void say_error(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    dprintf(2, "%s: error: %s\n", OGH_PROGRAM, text);
    to_syslog(OGH_SYSLOG_PRI_ERR, "error: %s", text);
}

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
    if (g_slow)
        to_syslog(OGH_SYSLOG_PRI_INFO, "%s: every create, run and hook starts Python until `oci-gpu-hook launchers` "
                "(or install) is run again; handing over to Python", g_slow);
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

/* ------------------------------------------------------------------ reading */

/* 1 with the whole of fd in *out; 0 when it is unreadable; TOO_LARGE with the first OGH_MAX_INPUT bytes in *out
 * (the rest still unread) */
#define TOO_LARGE 2
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
                *out = buf;
                *len = n;
                return TOO_LARGE;
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

/* 1 with the whole of fd in *out, else 0 (unreadable or too large) */
static int read_all(int fd, char **out, size_t *len)
{
    int got = read_fd(fd, out, len);
    if (got == TOO_LARGE)
        free(*out);
    return got == 1;
}

/* a regular file: anything else (a FIFO, whose open would block; a socket; a device, whose open may act) is
 * never opened here: 0, and the Python path says what it is */
static int open_regular(const char *path)
{
    struct stat st;
    int fd;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) { /* replaced in between */
        close(fd);
        return -1;
    }
    return fd;
}

static int read_path(const char *path, char **out, size_t *len)
{
    struct stat st;
    int ok, fd = open_regular(path);
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > OGH_MAX_INPUT) {
        close(fd);
        return 0;
    }
    ok = read_all(fd, out, len);
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

/* a span of the text: a key, a process.env entry */
struct span {
    const char *s;
    size_t n;
};

/* A strict JSON reader (RFC 8259, as Python's json with strict=True and no NaN/Infinity) that only
 * validates, refuses what the Python path would refuse or might read otherwise (see the top), and notes the
 * top-level members the hook needs from the state. */
struct json {
    const char *s;
    size_t n, i;
    int depth;
    int spec;       /* a config.json: its field spellings and the types of process, process.env, annotations */
    int want_state; /* the state: note id, pid and bundle */
    const char *id, *bundle, *pid; /* spans of the top-level values, when want_state */
    size_t id_len, bundle_len, pid_len;
    const char *root_path;         /* a spec's root.path when root is an object and path a string (quotes and all) */
    size_t root_path_len;
    struct span *masked;           /* a spec's process.env entries that ask for nothing (no_request), for clean */
    size_t nmasked;
    int devices;                   /* a spec's linux.devices is a non-empty array (a rootless hook checks them) */
};

/* what a value must be, where the Python path reads it (oci_spec.process_env, ContainerSpec.annotations) */
enum want { ANY, TOP, PROCESS, ENV, OBJECT, STRING, ROOT, LINUX, DEVICES };

#define MAX_DEPTH 100      /* Python reads ~1,000 levels; configs have ~6 */
#define MAX_KEYS 1024      /* keys of one object compared pairwise */
#define MAX_NUMBER 1000    /* characters of one number (Python: integers of up to 4,000 digits) */
#define MAX_MASKED 16      /* process.env entries that ask for nothing, set aside from the scan (more: hand over) */

/* 1 when the process.env entry ``e`` (a string's raw contents) is NAME=VALUE with NAME exactly one of
 * OGH_REQUEST_NAMES and VALUE one of OGH_NO_REQUEST_WORDS once the spaces around it are gone, in any ASCII case:
 * request.py _requested's ``v.strip().lower() not in NO_GPU`` is false for it.  Only where that is certain: no
 * escape (its text is its bytes) and ASCII only (Python's strip also takes Unicode spaces, its lower Unicode
 * letters); a raw JSON string holds no control character, so a space is the only ASCII whitespace it can hold. */
static int no_request(const char *e, size_t n)
{
    const char *eq = memchr(e, '=', n), *v, *end = e + n;
    int named = 0;
    if (!eq)
        return 0;
    for (size_t k = 0; k < n; k++)
        if (e[k] == '\\' || (unsigned char)e[k] >= 0x80)
            return 0;
    for (int i = 0; OGH_REQUEST_NAMES[i]; i++)
        if (strlen(OGH_REQUEST_NAMES[i]) == (size_t)(eq - e) && memcmp(OGH_REQUEST_NAMES[i], e, (size_t)(eq - e)) == 0)
            named = 1;
    if (!named)
        return 0;
    for (v = eq + 1; v < end && *v == ' '; v++)
        ;
    while (end > v && end[-1] == ' ')
        end--;
    for (int i = 0; OGH_NO_REQUEST_WORDS[i]; i++)
        if (strlen(OGH_NO_REQUEST_WORDS[i]) == (size_t)(end - v) &&
            strncasecmp(OGH_NO_REQUEST_WORDS[i], v, (size_t)(end - v)) == 0)
            return 1;
    return 0;
}

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

/* A number, and one that Python's reading takes (fastjson._parse_int: at most 4,000 digits; _parse_float: no
 * overflow to infinity): an integer of up to MAX_NUMBER characters; with a fraction or an exponent, digits before
 * the point D and exponent E with D + E <= 308, so that |x| < 10^308 < DBL_MAX. */
static int jnumber(struct json *j)
{
    size_t start = j->i, digits = 0;
    long exponent = 0;
    int real = 0;
    if (j->i < j->n && j->s[j->i] == '-')
        j->i++;
    if (j->i >= j->n || !isdigit((unsigned char)j->s[j->i]))
        return 0;
    if (j->s[j->i] == '0') {
        j->i++;
        digits = 1;
    } else {
        while (j->i < j->n && isdigit((unsigned char)j->s[j->i])) {
            j->i++;
            digits++;
        }
    }
    if (j->i < j->n && j->s[j->i] == '.') {
        real = 1;
        j->i++;
        if (j->i >= j->n || !isdigit((unsigned char)j->s[j->i]))
            return 0;
        while (j->i < j->n && isdigit((unsigned char)j->s[j->i]))
            j->i++;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        int negative = 0;
        real = 1;
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            negative = j->s[j->i++] == '-';
        if (j->i >= j->n || !isdigit((unsigned char)j->s[j->i]))
            return 0;
        while (j->i < j->n && isdigit((unsigned char)j->s[j->i])) {
            if (exponent < 100000)
                exponent = exponent * 10 + (j->s[j->i] - '0');
            j->i++;
        }
        if (negative)
            exponent = -exponent;
    }
    if (j->i - start > MAX_NUMBER)
        return 0;
    return !real || (long)digits + exponent <= 308;
}

static int jvalue(struct json *j, enum want want);

static int jliteral(struct json *j, const char *word)
{
    size_t k = strlen(word);
    if (j->n - j->i < k || memcmp(j->s + j->i, word, k) != 0)
        return 0;
    j->i += k;
    return 1;
}

/* A key that oci_spec.loads reads as its bytes and compares as Go does: no escape (its text is its bytes), ASCII
 * only (ASCII case is then all the folding that str.lower and Go's EqualFold do), and in a spec no field name
 * of config.json spelled in another case (oci_spec._check_case refuses those at the levels it reads). */
static int key_ok(const struct json *j, const char *key, size_t len)
{
    int other_case = 0;
    for (size_t k = 0; k < len; k++)
        if (key[k] == '\\' || (unsigned char)key[k] >= 0x80)
            return 0;
    if (!j->spec)
        return 1;
    for (int f = 0; OGH_FIELD_NAMES[f]; f++) {
        if (strlen(OGH_FIELD_NAMES[f]) != len || strncasecmp(OGH_FIELD_NAMES[f], key, len) != 0)
            continue;
        if (memcmp(OGH_FIELD_NAMES[f], key, len) == 0)
            return 1;
        other_case = 1;
    }
    return !other_case;
}

/* what the member ``key`` of an object of kind ``kind`` must be */
static enum want member_want(const struct json *j, enum want kind, const char *key, size_t len)
{
    if (!j->spec)
        return ANY;
    if (kind == TOP && len == 7 && memcmp(key, "process", 7) == 0)
        return PROCESS;
    if (kind == TOP && len == 11 && memcmp(key, "annotations", 11) == 0)
        return OBJECT;
    if (kind == TOP && len == 4 && memcmp(key, "root", 4) == 0)
        return ROOT;
    if (kind == PROCESS && len == 3 && memcmp(key, "env", 3) == 0)
        return ENV;
    if (kind == TOP && len == 5 && memcmp(key, "linux", 5) == 0)
        return LINUX;
    if (kind == LINUX && len == 7 && memcmp(key, "devices", 7) == 0)
        return DEVICES;
    return ANY;
}

/* an object (kind TOP, PROCESS, OBJECT or ANY) or an array (kind ENV: of strings) at j->i */
static int jcontainer(struct json *j, char open, enum want kind)
{
    char close = open == '{' ? '}' : ']';
    struct span local[16], *keys = local;
    size_t nkeys = 0, cap = sizeof local / sizeof local[0];
    int ok = 0;
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
        enum want want = kind == ENV ? STRING : ANY;
        ws(j);
        if (open == '{') {
            if (!jstring(j, &key, &key_len) || !key_ok(j, key, key_len))
                goto done;
            /* no key twice, in any ASCII case: oci_spec._pairs and oci_state._unique_keys refuse repeats, and Go
             * decodes keys of one struct that fold alike into one field */
            for (size_t k = 0; k < nkeys; k++)
                if (keys[k].n == key_len && strncasecmp(keys[k].s, key, key_len) == 0)
                    goto done;
            if (nkeys == cap) {
                struct span *bigger;
                if (cap >= MAX_KEYS)
                    goto done;
                bigger = malloc(2 * cap * sizeof *bigger);
                if (!bigger)
                    goto done;
                memcpy(bigger, keys, nkeys * sizeof *keys);
                if (keys != local)
                    free(keys);
                keys = bigger;
                cap *= 2;
            }
            keys[nkeys].s = key;
            keys[nkeys++].n = key_len;
            ws(j);
            if (j->i >= j->n || j->s[j->i] != ':')
                goto done;
            j->i++;
            ws(j);
            want = member_want(j, kind, key, key_len);
        }
        vstart = j->i;
        if (!jvalue(j, want))
            goto done;
        if (kind == ENV && j->masked && j->nmasked < MAX_MASKED &&
            no_request(j->s + vstart + 1, j->i - vstart - 2)) {
            j->masked[j->nmasked].s = j->s + vstart + 1;
            j->masked[j->nmasked++].n = j->i - vstart - 2;
        }
        if (kind == ROOT && key_len == 4 && memcmp(key, "path", 4) == 0 && j->s[vstart] == '"') {
            j->root_path = j->s + vstart;
            j->root_path_len = j->i - vstart;
        }
        if (kind == TOP && j->want_state) {
            const char *v = j->s + vstart;
            size_t vlen = j->i - vstart;
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
            goto done;
        if (j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->s[j->i] == close) {
            j->i++;
            j->depth--;
            ok = 1;
        }
        goto done;
    }
done:
    if (keys != local)
        free(keys);
    return ok;
}

static int jvalue(struct json *j, enum want want)
{
    const char *s;
    size_t len;
    ws(j);
    if (j->i >= j->n)
        return 0;
    switch (want) {
    case TOP:
        return j->s[j->i] == '{' && jcontainer(j, '{', TOP);
    case PROCESS: /* oci_spec.field: absent, null or an object */
    case OBJECT:
        return j->s[j->i] == '{' ? jcontainer(j, '{', want) : jliteral(j, "null");
    case ENV: /* oci_spec.process_env: null or a list of strings */
        return j->s[j->i] == '[' ? jcontainer(j, '[', ENV) : jliteral(j, "null");
    case STRING:
        return jstring(j, &s, &len);
    case ROOT: /* ContainerSpec.root: read when an object, else any value (the hook then finds no root.path) */
        if (j->s[j->i] == '{')
            return jcontainer(j, '{', ROOT);
        break;
    case LINUX: /* only to find linux.devices; any value is read as before */
        if (j->s[j->i] == '{')
            return jcontainer(j, '{', LINUX);
        break;
    case DEVICES: /* a non-empty array: devices the runtime is given (CDI's, --device's) */
        if (j->s[j->i] == '[') {
            size_t k = j->i + 1;
            while (k < j->n && (j->s[k] == ' ' || j->s[k] == '\t' || j->s[k] == '\n' || j->s[k] == '\r'))
                k++;
            j->devices = k < j->n && j->s[k] != ']';
        }
        break;
    case ANY:
        break;
    }
    switch (j->s[j->i]) {
    case '{':
    case '[':
        return jcontainer(j, j->s[j->i], ANY);
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

/* 1: valid UTF-8, one JSON object as described above and nothing else */
static int json_object_ok(struct json *j)
{
    if (!utf8_ok((const unsigned char *)j->s, j->n))
        return 0;
    ws(j);
    if (!jvalue(j, TOP))
        return 0;
    ws(j);
    return j->i == j->n;
}

/* 1 only when no byte sequence in ``s`` could make a request: see the comment at the top.  The ``nmasked``
 * process.env entries ``masked`` ask for nothing: they are blanked (NUL bytes, in no needle) before the scan. */
static int clean(const char *s, size_t n, const struct span *masked, size_t nmasked)
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
    for (size_t m = 0; m < nmasked; m++)
        memset(lower + (masked[m].s - s), 0, masked[m].n);
    for (i = 0; OGH_NEEDLES[i]; i++) {
        if (memmem(lower, n, OGH_NEEDLES[i], strlen(OGH_NEEDLES[i]))) {
            ok = 0;
            break;
        }
    }
    free(lower);
    return ok;
}

/* ``devices`` (when not NULL): set to whether linux.devices is a non-empty array */
static int spec_clean_devices(const char *s, size_t n, int *devices)
{
    struct span masked[MAX_MASKED];
    struct json j = {.s = s, .n = n, .spec = 1, .masked = masked};
    int ok = json_object_ok(&j) && clean(s, n, masked, j.nmasked);
    if (devices)
        *devices = j.devices;
    return ok;
}

static int spec_clean(const char *s, size_t n)
{
    return spec_clean_devices(s, n, NULL);
}

/* the config.json at ``path`` exists, is read and is clean (a missing one: Python says so) */
static int file_clean(const char *path)
{
    char *buf;
    size_t len;
    int ok;
    if (!read_path(path, &buf, &len))
        return 0;
    ok = spec_clean(buf, len);
    free(buf);
    return ok;
}

/* ------------------------------------------------------------------ settings */

/* 1 when ``word`` is one of ``list`` (a NULL-terminated list), compared exactly */
static int in_list(const char *word, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(word, list[i]) == 0)
            return 1;
    return 0;
}

/* a value config.check_value takes for a bool field from the environment: one of OGH_BOOL_WORDS in any case */
static int bool_ok(const char *v)
{
    for (int i = 0; OGH_BOOL_WORDS[i]; i++)
        if (strcasecmp(v, OGH_BOOL_WORDS[i]) == 0)
            return 1;
    return 0;
}

/* The config file is the one baked: byte for byte the same (none when none was baked). */
static int config_as_baked(int named)
{
    char *buf;
    size_t len;
    struct stat st;
    int same, fd;
    if (stat(OGH_CONFIG_PATH, &st) != 0) /* as Python: a missing default file is no file; a named one, an error */
        return !OGH_CONFIG_EXISTS && errno == ENOENT && !named;
    if ((fd = open_regular(OGH_CONFIG_PATH)) < 0)
        return 0;
    if (!OGH_CONFIG_EXISTS) {
        close(fd);
        return 0;
    }
    same = read_all(fd, &buf, &len);
    close(fd);
    if (!same)
        return 0;
    same = len == (size_t)OGH_CONFIG_LEN && memcmp(buf, OGH_CONFIG_BYTES, len) == 0;
    free(buf);
    return same;
}

/* The baked defaults, as the Python launcher's os.environ.setdefault; then 1 when the settings are
 * still the ones baked in: the same config file, unchanged, and no OCI_GPU_HOOK_* value that Python
 * would reject (only the bool variables have values to reject; the others are paths and strings).
 * Whether the file is still trusted is asked apart (config_still_trusted): a pass-through command needs
 * only the runtime, which is the baked one while the bytes are.
 * (Values that only narrow what is granted, or say where to log, do not matter to a container that asks
 * for nothing: Python logs no line for it.) */
static int settings_as_baked(void)
{
    const char *path, *v;
    for (int i = 0; OGH_DEFAULTS[i]; i += 2)
        setenv(OGH_DEFAULTS[i], OGH_DEFAULTS[i + 1], 0);
    if (!OGH_FAST) {
        g_slow = "this launcher was built without a fast path for its config";
        return 0;
    }
    for (int i = 0; OGH_BOOL_ENV[i]; i++) {
        v = getenv(OGH_BOOL_ENV[i]);
        if (v && !bool_ok(v))
            return 0;
    }
    path = getenv(OGH_CONFIG_ENV);
    if (path && !path[0])
        path = NULL;
    if (strcmp(path ? path : OGH_DEFAULT_CONFIG, OGH_CONFIG_PATH) != 0)
        return 0;
    if (!config_as_baked(path != NULL)) {
        g_slow = "the config file changed since this launcher was built";
        return 0;
    }
    return 1;
}

/* config.check_trusted still passes for the config file, there or not (load_config walks an absent one too: a
 * directory given away, a pinned file gone): else Python refuses it */
static int config_still_trusted(void)
{
    return trusted(OGH_CONFIG_PATH, 0);
}

/* ------------------------------------------------------------------ the resident planner */

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

/* The planner (oci_gpu_hook/host/planner/, `oci-gpu-hook serve`) answers what the Python launcher would
 * have done with this argv, environment, stdin, working directory, root and namespaces, which the front sends
 * (the namespaces, root and cwd as file descriptors); the front then writes its stdout and stderr bytes and
 * exits with its status, or execs the runtime it names.  The planner writes config.json itself, as Python does
 * (atomic.write_atomic: a rename, never a half-written file).  No socket, a socket in a directory that is not
 * root's alone, a server that is not root, a planner of another version or build, a refusal (a front whose
 * credentials are not the planner's, a planner whose package changed on disk), anything short or late: the
 * front falls back to the Python launcher, which gives the same outcome.  Once or not at all: the planner says
 * READY before it changes anything; the front says GO only within OGH_PLANNER_TIMEOUT_MS of its start, else it
 * falls back; after GO it falls back only when the connection ends before the planner's STARTED, and after
 * STARTED it never runs the request again (a planner that dies or fails then: one line, status 1).
 * The protocol: planner/protocol.py read_request, encode_answer; planner/worker.py serve_one. */

struct out {
    char *p;
    size_t n, cap;
    int failed;
};

static void out_bytes(struct out *o, const void *s, size_t n)
{
    if (o->failed)
        return;
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 65536;
        char *bigger;
        while (cap < o->n + n)
            cap *= 2;
        bigger = realloc(o->p, cap);
        if (!bigger) {
            o->failed = 1;
            return;
        }
        o->p = bigger;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void out_u32(struct out *o, size_t v)
{
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    if (v > 0xffffffffUL)
        o->failed = 1;
    out_bytes(o, b, 4);
}

static void out_field(struct out *o, const char *s, size_t n)
{
    out_u32(o, n);
    out_bytes(o, s, n);
}

static void out_str(struct out *o, const char *s)
{
    out_field(o, s, strlen(s));
}

static void out_num(struct out *o, long v)
{
    char digits[32];
    snprintf(digits, sizeof digits, "%ld", v);
    out_str(o, digits);
}

static long ms_left(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (deadline->tv_sec - now.tv_sec) * 1000 + (deadline->tv_nsec - now.tv_nsec) / 1000000;
}

/* fd ready for ``events`` before ``deadline`` (NULL: however long it takes) */
static int wait_for(int fd, short events, const struct timespec *deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        long left = deadline ? ms_left(deadline) : -1;
        int got;
        if (deadline && left <= 0)
            return 0;
        got = poll(&p, 1, (int)left);
        if (got < 0 && errno == EINTR)
            continue;
        return got > 0;
    }
}

static int send_all(int fd, const char *s, size_t n, const struct timespec *deadline)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w > 0) {
            s += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (!(w < 0 && errno == EAGAIN && wait_for(fd, POLLOUT, deadline))) {
            return 0;
        }
    }
    return 1;
}

static int recv_all(int fd, char *s, size_t n, const struct timespec *deadline)
{
    while (n) {
        ssize_t r = recv(fd, s, n, 0);
        if (r > 0) {
            s += r;
            n -= (size_t)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (!(r < 0 && errno == EAGAIN && wait_for(fd, POLLIN, deadline))) {
            return 0;
        }
    }
    return 1;
}

static size_t get_u32(const char *p)
{
    const unsigned char *b = (const unsigned char *)p;
    return ((size_t)b[0] << 24) | ((size_t)b[1] << 16) | ((size_t)b[2] << 8) | (size_t)b[3];
}

/* the next field of an answer: 1 with its span, 0 when the answer ends early */
static int take(const char **at, const char *end, const char **s, size_t *n)
{
    if (end - *at < 4)
        return 0;
    *n = get_u32(*at);
    if ((size_t)(end - *at - 4) < *n)
        return 0;
    *s = *at + 4;
    *at += 4 + *n;
    return 1;
}

static int span_is(const char *s, size_t n, const char *word)
{
    return n == strlen(word) && memcmp(s, word, n) == 0;
}

/* the planner's socket directory: a real directory, root's, mode 0700, on a path root alone can change */
static int planner_dir_ok(const char *socket_path)
{
    char dir[PATH_MAX];
    struct stat st;
    char *slash;
    if (strlen(socket_path) >= sizeof dir)
        return 0;
    strcpy(dir, socket_path);
    slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 && !(st.st_mode & 077) &&
           trusted(dir, 1);
}

static void exec_path(const char *path);

/* The journal's info line for a planner that is there but does not serve this request (the front then starts
 * Python: slower, same outcome).  None where no planner runs: no directory, no socket (it was stopped). */
static void planner_handover(const char *socket_path, int sock, int answered, const struct timespec *deadline)
{
    int err = errno;
    struct sockaddr_un peer;
    socklen_t peer_len = sizeof peer;
    const char *why;
    if (sock < 0 || getpeername(sock, (struct sockaddr *)&peer, &peer_len) != 0) {
        if (err == ENOENT)
            return;
        to_syslog(OGH_SYSLOG_PRI_INFO, "the planner at %s cannot be reached (%s); handing over to Python",
                socket_path, strerror(err));
        return;
    }
    if (answered)
        why = "handed the request back (a planner of another version, or a request it does not serve: see its log)";
    else if (ms_left(deadline) <= 0)
        why = "did not answer in time";
    else
        why = "broke the exchange off";
    to_syslog(OGH_SYSLOG_PRI_INFO, "the planner at %s %s; handing over to Python", socket_path, why);
}

/* Ask the planner (see above): returns only when the front is to fall back to the Python launcher. */
static void ask_planner(const char *input, size_t len)
{
    static const char *const namespaces[] = {"/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/cgroup",
                                             "/proc/self/ns/user", NULL};
    const char *socket_path = getenv(OGH_PLANNER_ENV);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timespec deadline;
    struct ucred cred;
    socklen_t cred_len = sizeof cred;
    struct out req = {0};
    char header[8], *answer = NULL;
    int fds[6], nfds = 0, sock = -1, answered = 0;
    mode_t mask;
    size_t count = 0, body;
    if (!socket_path)
        socket_path = OGH_PLANNER_SOCKET;
    if (socket_path[0] != '/' || strlen(socket_path) >= sizeof addr.sun_path)
        return;
    check_trust(); /* what to_python refuses, the planner does not do either */
    read_identity();
    if (!g_privileged || !planner_dir_ok(socket_path))
        return; /* the planner acts as root: a front without root's privilege (rootless podman's hook) runs alone */
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += OGH_PLANNER_TIMEOUT_MS / 1000;
    deadline.tv_nsec += (OGH_PLANNER_TIMEOUT_MS % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    strcpy(addr.sun_path, socket_path);
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0)
        goto fallback; /* absent, refused, or its backlog full (EAGAIN) */
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 || cred.uid != 0)
        goto fallback;
    for (; namespaces[nfds]; nfds++)
        if ((fds[nfds] = open(namespaces[nfds], O_RDONLY | O_CLOEXEC)) < 0)
            goto fallback;
    if ((fds[nfds] = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        goto fallback;
    nfds++;
    if ((fds[nfds] = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        goto fallback;
    nfds++;
    mask = umask(0);
    umask(mask);
    out_bytes(&req, "OGHQ\0\0\0\0", 8); /* the length goes in last */
    out_str(&req, OGH_PLANNER_VERSION);
    out_str(&req, OGH_ROLE_NAME);
    out_str(&req, OGH_SELF);
    out_str(&req, OGH_ROLE == OGH_ROLE_SHIM ? OGH_RUNTIME : ""); /* the runtime the Python launcher has baked */
    out_num(&req, (long)getppid());
    out_num(&req, (long)mask);
    out_num(&req, (long)prctl(PR_GET_SECUREBITS, 0, 0, 0, 0));
    out_u32(&req, g_argc > 1 ? (size_t)g_argc - 1 : 0);
    for (int i = 1; i < g_argc; i++)
        out_str(&req, g_argv[i]);
    for (char **e = environ; *e; e++)
        count++;
    out_u32(&req, count);
    for (char **e = environ; *e; e++)
        out_str(&req, *e);
    out_str(&req, input ? "1" : "0");
    out_field(&req, input ? input : "", input ? len : 0);
    if (req.failed)
        goto fallback;
    body = req.n - 8;
    req.p[4] = (char)(body >> 24);
    req.p[5] = (char)(body >> 16);
    req.p[6] = (char)(body >> 8);
    req.p[7] = (char)body;
    {
        union {
            struct cmsghdr align;
            char bytes[CMSG_SPACE(sizeof fds)];
        } control;
        struct iovec iov = {.iov_base = req.p, .iov_len = 8};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                             .msg_controllen = sizeof control.bytes};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(c), fds, sizeof fds);
        if (sendmsg(sock, &msg, MSG_NOSIGNAL) != 8)
            goto fallback;
    }
    if (!send_all(sock, req.p + 8, body, &deadline))
        goto fallback;
    free(req.p);
    req.p = NULL;
    /* READY (else a refusal, or nothing in time: Python), GO while inside the bound, then STARTED */
    if (!recv_all(sock, header, 4, &deadline))
        goto fallback;
    answered = memcmp(header, "OGHR", 4) != 0; /* its refusal: handed back before it did anything */
    if (answered || ms_left(&deadline) <= 0 || !send_all(sock, "OGHG", 4, &deadline) ||
        !recv_all(sock, header, 4, NULL) || memcmp(header, "OGHS", 4) != 0)
        goto fallback;
    if (!recv_all(sock, header, sizeof header, NULL) || memcmp(header, "OGHA", 4) != 0)
        goto started;
    body = get_u32(header + 4);
    if (body > OGH_PLANNER_MAX_ANSWER || !(answer = malloc(body ? body : 1)) || !recv_all(sock, answer, body, NULL))
        goto started;
    {
        const char *at = answer, *end = answer + body, *f[7];
        size_t n[7];
        long code = 0;
        for (int i = 0; i < 7; i++)
            if (!take(&at, end, &f[i], &n[i]))
                goto fallback;
        /* version, status, exit status, runtime to exec, an environment entry for it, stdout, stderr */
        if (at != end || !span_is(f[0], n[0], OGH_PLANNER_VERSION) || !span_is(f[1], n[1], "ok") || !n[2] ||
            n[2] > 3 || n[3] >= PATH_MAX || memchr(f[3], '\0', n[3]) || memchr(f[4], '\0', n[4]))
            goto started;
        for (size_t k = 0; k < n[2]; k++) {
            if (!isdigit((unsigned char)f[2][k]))
                goto started;
            code = code * 10 + (f[2][k] - '0');
        }
        if (code > 255)
            goto started;
        /* as the Python launcher: SIGPIPE and SIGXFSZ ignored (CPython does so at start; exec keeps it) */
        signal(SIGPIPE, SIG_IGN);
        signal(SIGXFSZ, SIG_IGN);
        if (!write_all(1, f[5], n[5]) || !write_all(2, f[6], n[6])) {
            say_error("cannot write the planner's answer: %s", strerror(errno));
            _exit(1); /* the request is not run again */
        }
        close(sock);
        if (n[3]) {
            char runtime[PATH_MAX];
            memcpy(runtime, f[3], n[3]);
            runtime[n[3]] = '\0';
            if (n[4]) { /* CPython's C locale coercion (PEP 538): LC_CTYPE set for the runtime too */
                char *entry = strndup(f[4], n[4]);
                if (!entry || !strchr(entry, '=') || putenv(entry) != 0)
                    _exit(1);
            }
            exec_path(runtime);
        }
        _exit((int)code);
    }
started: /* the planner began and did not finish: what it did is not done twice */
    say_error("the resident planner did not finish this request (it is not run again; see the planner's log): "
              "start the container again");
    _exit(1);
fallback:
    planner_handover(socket_path, sock, answered, &deadline);
    free(req.p);
    free(answer);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (sock >= 0)
        close(sock);
}

/* exec ``path`` with this front's arguments, as entry/runtime.py main does: argv[0] is the runtime's path */
static void exec_path(const char *path)
{
    size_t n = g_argc > 1 ? (size_t)g_argc : 1;
    char **args = calloc(n + 1, sizeof *args);
    if (!args)
        _exit(1);
    args[0] = (char *)path;
    for (int i = 1; i < g_argc; i++)
        args[i] = g_argv[i];
    args[n] = NULL;
    execv(path, args);
    say_error("cannot run %s: %s", path, strerror(errno));
    _exit(1);
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
            search = OGH_DEFAULT_PATH;
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
    /* resolve_runtime's code_problem: the runtime is code run with this process's privilege, so it passes the
     * trust rule or Python decides (and refuses it with one line); a relative path is walked from the cwd */
    if (g_runtime[0] != '/') {
        char here[PATH_MAX], whole[2 * PATH_MAX];
        if (!getcwd(here, sizeof here) || snprintf(whole, sizeof whole, "%s/%s", here, g_runtime) >= PATH_MAX)
            return 0;
        return trusted(whole, 1);
    }
    return trusted(g_runtime, 1);
}

static void exec_runtime(void)
{
    exec_path(g_runtime); /* argv[0] is the runtime even when this front was started with no argv at all (argc 0) */
}

/* a value both runtimes take as it stands: not empty and no option (runc's flag package and crun's getopt both
 * take "--bundle -x" as the bundle "-x", but no runtime caller writes that) */
static int plain_value(const char *v)
{
    return v && v[0] && v[0] != '-';
}

/* g_argv[*i] is one of ``options`` ("NAME" a flag, "NAME=" an option with a value), spelled --NAME, --NAME=V,
 * --NAME V, or -N / -N V for a one-letter NAME: the option (with *i past it and its value in *value), else NULL */
static const char *common_option(int *i, const char *const *options, const char **value)
{
    const char *arg = g_argv[*i];
    for (int k = 0; options[k]; k++) {
        size_t len = strlen(options[k]);
        int takes = options[k][len - 1] == '=';
        const char *v = NULL;
        size_t name_len = len - (size_t)takes;
        if (name_len == 1 && arg[0] == '-' && arg[1] == options[k][0] && !arg[2])
            ; /* -N */
        else if (strncmp(arg, "--", 2) == 0 && strncmp(arg + 2, options[k], name_len) == 0 &&
                 (arg[2 + name_len] == '\0' || arg[2 + name_len] == '='))
            v = arg[2 + name_len] == '=' ? arg + 3 + name_len : NULL;
        else
            continue;
        if (!takes) {
            if (v)
                return NULL; /* --flag=VALUE: runc reads a bool, crun refuses */
            *value = NULL;
            (*i)++;
            return options[k];
        }
        if (!v) {
            if (*i + 1 >= g_argc)
                return NULL;
            v = g_argv[++*i];
        }
        if (!plain_value(v))
            return NULL;
        *value = v;
        (*i)++;
        return options[k];
    }
    return NULL;
}

/* The config.json that the runtime opens for this create/run, when the command line has the form that podman
 * (conmon), containerd and Docker write and that runc 1.1 (urfave/cli over Go's flag package) and crun 1.8
 * (glibc argp) read alike; else NULL, and Python reads the command line with the rules of the real runtime
 * (oci_argv.parse_argv, oci_argv.config_path).  The form:
 *
 *   [GLOBAL...] create|run [OPTION...] ID
 *   GLOBAL  --root V, --log V, --log-format text|json (each also --NAME=V), --debug, --systemd-cgroup
 *   OPTION  --bundle V, -b V, --bundle=V (one of them, once), --pid-file V, --console-socket V (also --NAME=V),
 *           --no-pivot, --no-new-keyring, --preserve-fds N; for run also --detach, -d
 *
 * where no V is empty or starts with '-', N is a decimal number, and ID is the last argument, not empty and no
 * option.  Both runtimes then open BUNDLE/config.json, BUNDLE being the working directory when not named. */
static const char *common_config_path(char *path, size_t size)
{
    static const char *const globals[] = {"root=", "log=", "log-format=", "debug", "systemd-cgroup", NULL};
    static const char *const create_options[] = {"bundle=", "b=", "pid-file=", "console-socket=", "no-pivot",
                                                 "no-new-keyring", "preserve-fds=", NULL};
    static const char *const run_options[] = {"bundle=", "b=", "pid-file=", "console-socket=", "no-pivot",
                                              "no-new-keyring", "preserve-fds=", "detach", "d", NULL};
    const char *bundle = NULL, *value, *option, *id;
    int i = 1, run;
    while (i < g_argc && g_argv[i][0] == '-') {
        if (!(option = common_option(&i, globals, &value)))
            return NULL;
        if (strcmp(option, "log-format=") == 0 && strcmp(value, "text") != 0 && strcmp(value, "json") != 0)
            return NULL;
    }
    if (i >= g_argc || !in_list(g_argv[i], OGH_REWRITE_COMMANDS))
        return NULL;
    run = strcmp(g_argv[i++], "run") == 0;
    while (i < g_argc - 1) {
        if (!(option = common_option(&i, run ? run_options : create_options, &value)))
            return NULL;
        if (strcmp(option, "bundle=") == 0 || strcmp(option, "b=") == 0) {
            if (bundle)
                return NULL; /* runc refuses some pairs ("Cannot use two forms of the same flag") */
            bundle = value;
        } else if (strcmp(option, "preserve-fds=") == 0) {
            size_t len = strlen(value);
            if (len > 9 || strspn(value, "0123456789") != len || (value[0] == '0' && len > 1))
                return NULL;
        }
    }
    if (i != g_argc - 1)
        return NULL;
    id = g_argv[i];
    if (!id[0] || id[0] == '-')
        return NULL;
    note_container(id, strlen(id));
    if (!bundle)
        bundle = ".";
    if ((size_t)snprintf(path, size, "%s%sconfig.json", bundle, bundle[strlen(bundle) - 1] == '/' ? "" : "/") >=
        size)
        return NULL;
    return path;
}

int main(int argc, char **argv)
{
    int as_baked, rewrite = 0, common;
    const char *name;
    char path[PATH_MAX];
    g_argc = argc;
    g_argv = argv;
    as_baked = settings_as_baked();
    for (int i = 1; i < argc; i++)
        if (in_list(argv[i], OGH_REWRITE_COMMANDS))
            rewrite = 1;
    name = getenv(OGH_RUNTIME_ENV);
    if (!name || !name[0])
        name = as_baked ? OGH_RUNTIME : NULL;
    if (!rewrite) {
        /* pass-through: the config file is not parsed here; the runtime named in it is used while the file
         * holds the bytes baked, else Python decides (it falls back to runc when the file is broken) */
        if (!name || !find_runtime(name)) {
            const char *what = "";
            /* Python cannot be trusted here: the runtime of the install still gets the command */
            if (untrusted(&what) && find_runtime(OGH_RUNTIME))
                exec_runtime();
            to_python(NULL, 0, 0);
        }
        if (argc == 2 && in_list(argv[1], OGH_VERSION_ARGS)) {
            dprintf(1, "%s\n", OGH_VERSION_LINE);
        }
        exec_runtime();
    }
    common = common_config_path(path, sizeof path) != NULL; /* argv alone (it names the container for the journal) */
    if (as_baked && config_still_trusted() && find_runtime(name) && common && file_clean(path))
        exec_runtime();
    ask_planner(NULL, 0);
    to_python(NULL, 0, 0);
    return 1;
}
#endif

/* ------------------------------------------------------------------ the hooks */

#if OGH_ROLE == OGH_ROLE_HOOK
/* The state's pid and bundle as oci_state.parse_state accepts them (the id a non-empty string, the pid a positive
 * integer, the bundle an absolute path), read only where certain: no escape anywhere, and a JSON text the
 * strict reader takes.  ``bundle`` gets the bundle's path. */
static int read_state(const char *s, size_t n, long *pid, char *bundle, size_t size)
{
    struct json j = {.s = s, .n = n, .want_state = 1};
    if (memchr(s, '\\', n) || !json_object_ok(&j))
        return 0;
    if (!j.id || j.id_len < 3 || j.id[0] != '"')
        return 0;
    note_container(j.id + 1, j.id_len - 2);
    if (!j.pid || j.pid_len < 1 || j.pid_len > 9 || j.pid[0] < '1' || j.pid[0] > '9')
        return 0;
    *pid = 0;
    for (size_t k = 0; k < j.pid_len; k++) {
        if (!isdigit((unsigned char)j.pid[k]))
            return 0;
        *pid = *pid * 10 + (j.pid[k] - '0');
    }
    if (!j.bundle || j.bundle_len < 3 || j.bundle[0] != '"' || j.bundle[1] != '/')
        return 0;
    if (j.bundle_len - 2 + sizeof "/config.json" > size || memchr(j.bundle + 1, '\0', j.bundle_len - 2))
        return 0;
    memcpy(bundle, j.bundle + 1, j.bundle_len - 2);
    bundle[j.bundle_len - 2] = '\0';
    return 1;
}

/* os.path.join(directory, "config.json"); 0 when it does not fit */
static int config_in(char *path, size_t size, const char *directory)
{
    int n = snprintf(path, size, "%s%sconfig.json", directory, directory[strlen(directory) - 1] == '/' ? "" : "/");
    return n > 0 && (size_t)n < size;
}

/* the state as parse_state accepts it, and the bundle's config.json clean */
static int state_clean(const char *s, size_t n)
{
    char bundle[PATH_MAX], path[PATH_MAX];
    long pid;
    if (!read_state(s, n, &pid, bundle, sizeof bundle) || !config_in(path, sizeof path, bundle))
        return 0;
    return file_clean(path);
}

/* ---------------------------------------------------------- links: the createRuntime hook without Python */

/* core/edits.py check_link: PATH is OGH_BY_PATH_DIR + NAME (NAME not empty, no '/', not "." or ".."), TARGET is
 * "../" + one of OGH_LINK_NODES + ASCII digits (at least one) */
static int link_ok(const char *path, const char *target)
{
    size_t dir = strlen(OGH_BY_PATH_DIR);
    const char *name = path + dir, *base = target + 3;
    int node = 0;
    if (strncmp(path, OGH_BY_PATH_DIR, dir) != 0 || !name[0] || strchr(name, '/') || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0 || strncmp(target, "../", 3) != 0)
        return 0;
    for (int i = 0; OGH_LINK_NODES[i] && !node; i++) {
        size_t k = strlen(OGH_LINK_NODES[i]);
        const char *digits = base + k;
        if (strncmp(base, OGH_LINK_NODES[i], k) != 0 || !digits[0])
            continue;
        node = strspn(digits, "0123456789") == strlen(digits);
    }
    return node;
}

/* os.path.normpath(os.path.join(bundle, path)) for an absolute ``bundle`` (ContainerSpec.root) */
static int root_path(const char *bundle, const char *path, size_t path_len, char *out, size_t size)
{
    char joined[2 * PATH_MAX], *parts[PATH_MAX / 2], *cursor, *part;
    size_t count = 0, at;
    int slashes;
    if (path_len >= PATH_MAX)
        return 0;
    if (path[0] == '/')
        snprintf(joined, sizeof joined, "%.*s", (int)path_len, path);
    else
        snprintf(joined, sizeof joined, "%s%s%.*s", bundle, bundle[strlen(bundle) - 1] == '/' ? "" : "/",
                 (int)path_len, path);
    slashes = joined[1] == '/' && joined[2] != '/' ? 2 : 1; /* POSIX keeps exactly two leading slashes */
    for (cursor = joined; (part = strsep(&cursor, "/")) != NULL;) {
        if (!part[0] || strcmp(part, ".") == 0)
            continue;
        if (strcmp(part, "..") == 0) { /* at the root, ".." stays there */
            if (count)
                count--;
            continue;
        }
        if (count == sizeof parts / sizeof parts[0])
            return 0;
        parts[count++] = part;
    }
    at = (size_t)slashes;
    if (at >= size)
        return 0;
    memset(out, '/', at);
    for (size_t k = 0; k < count; k++) {
        size_t n = strlen(parts[k]);
        if (at + n + 2 > size)
            return 0;
        if (k)
            out[at++] = '/';
        memcpy(out + at, parts[k], n);
        at += n;
    }
    out[at] = '\0';
    return 1;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* live.check_container: ``pid`` is the container of the bundle whose root is ``rootfs`` -- its parent is this
 * hook's parent (the runtime), it has a mount namespace of its own, and its root or working directory is
 * ``rootfs``.  Also what Python's way in needs (live.apply_in_container: setns into that mount namespace):
 * root with CAP_SYS_ADMIN and CAP_SYS_CHROOT. */
static int container_ok(long pid, const char *rootfs)
{
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2];
    char path[64], *data, *close_paren, *rest, *end;
    struct stat ns, own_ns, root, cwd, top;
    size_t len;
    long parent;
    if (geteuid() != 0 || syscall(SYS_capget, &head, caps) != 0 ||
        !(caps[0].effective & (1u << CAP_SYS_ADMIN)) || !(caps[0].effective & (1u << CAP_SYS_CHROOT)))
        return 0;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if (!read_path(path, &data, &len))
        return 0;
    close_paren = strrchr(data, ')');
    if (!close_paren || strlen(close_paren) < 2) {
        free(data);
        return 0;
    }
    rest = close_paren + 2;
    while (*rest && !isspace((unsigned char)*rest)) /* the state */
        rest++;
    while (isspace((unsigned char)*rest))
        rest++;
    errno = 0;
    parent = isdigit((unsigned char)*rest) ? strtol(rest, &end, 10) : -1;
    if (errno || parent < 0 || (*end && !isspace((unsigned char)*end))) {
        free(data);
        return 0;
    }
    free(data);
    snprintf(path, sizeof path, "/proc/%ld/ns/mnt", pid);
    if (stat(path, &ns) != 0 || stat("/proc/self/ns/mnt", &own_ns) != 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%ld/root", pid);
    if (stat(path, &root) != 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%ld/cwd", pid);
    if (stat(path, &cwd) != 0 || stat(rootfs, &top) != 0)
        return 0;
    return parent == (long)getppid() && !same_file(&ns, &own_ns) && (same_file(&top, &root) || same_file(&top, &cwd));
}

static int openat2_fd(int dirfd, const char *path, int flags, unsigned long long resolve)
{
    struct open_how how = {.flags = (unsigned long long)flags, .resolve = resolve};
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

/* The one walk inside a container root (oci_gpu_hook/core/inroot.py holds the rule) as the kernel does it:
 * FOLLOW mode, ``path`` below ``root`` with symlinks followed but never out of it (magic links, more than 40
 * links: refused, where Python's walk decides); -1 with errno otherwise. */
static int in_root(int root, const char *path)
{
    return openat2_fd(root, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
}

/* REFUSE mode: every component of ``dirs`` (changed in place) opened below ``root`` with RESOLVE_NO_SYMLINKS
 * (made 0755 where missing, as inroot.walk makes it), no "." or ".." (EINVAL, before anything is made); the last
 * one's fd, or -1 with errno. */
static int dir_beneath(int root, char *dirs)
{
    static const unsigned long long beneath = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH;
    char *cursor, *part;
    int fd;
    for (const char *p = dirs; *p; p++) {
        size_t len = strcspn(p, "/");
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) {
            errno = EINVAL;
            return -1;
        }
        p += len - (len ? 1 : 0);
    }
    fd = dup(root);
    for (cursor = dirs; fd >= 0 && (part = strsep(&cursor, "/")) != NULL;) {
        int child;
        if (!part[0])
            continue;
        child = openat2_fd(fd, part, O_RDONLY | O_DIRECTORY | O_CLOEXEC, beneath); /* a symlink: ELOOP */
        if (child < 0 && errno == ENOENT && (mkdirat(fd, part, 0755) == 0 || errno == EEXIST))
            child = openat2_fd(fd, part, O_RDONLY | O_DIRECTORY | O_CLOEXEC, beneath);
        {
            int saved = errno;
            close(fd);
            errno = saved;
        }
        fd = child;
    }
    return fd;
}

#ifdef OGH_WALK_PROBE
/* A test build only, never a launcher (tests/test_inroot.py compiles it with -DOGH_WALK_PROBE): for each
 * "follow PATH" or "refuse PATH" pair of arguments after ROOT, one line: "ok REAL" (the directory reached, from
 * ROOT, read back from /proc/self/fd) or "error ERRNO", so the tests hold these two calls to inroot.py's walk. */
int main(int argc, char **argv)
{
    char self[64], root_path[PATH_MAX], here[PATH_MAX], dirs[PATH_MAX];
    int root = open(argv[1], O_PATH | O_DIRECTORY | O_CLOEXEC);
    ssize_t n;
    umask(0);
    snprintf(self, sizeof self, "/proc/self/fd/%d", root);
    n = root < 0 ? -1 : readlink(self, root_path, sizeof root_path - 1);
    if (n < 0)
        return 2;
    root_path[n] = '\0';
    for (int i = 2; i + 1 < argc; i += 2) {
        int fd;
        snprintf(dirs, sizeof dirs, "%s", argv[i + 1]);
        fd = strcmp(argv[i], "follow") == 0 ? in_root(root, dirs) : dir_beneath(root, dirs);
        if (fd < 0) {
            printf("error %d\n", errno);
            continue;
        }
        snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
        n = readlink(self, here, sizeof here - 1);
        close(fd);
        if (n < 0)
            return 2;
        here[n] = '\0';
        printf("ok %s\n", strcmp(here, root_path) == 0 ? "/" : here + strlen(root_path));
    }
    return 0;
}
#define main ogh_role_main /* the role's own main below is then an unused function of this test build */
#endif

/* rootfs.make_nodes for links alone: below the container's root (/proc/PID/root, where setns would land),
 * ``rootfs`` opened as Python opens it there (symlinks followed, but never out of that root: in_root), then the
 * links' directory by dir_beneath (REFUSE mode), each link made or found pointing at its target.  0 at the first
 * thing that is not so (Python then does it all again, and says what is wrong); errno ENOSYS where the kernel
 * has no openat2. */
static int make_links(long pid, const char *rootfs, char *const *links, int count)
{
    char path[64], dirs[PATH_MAX], current[PATH_MAX];
    int proc_root, root, ok = 1;
    mode_t mask;
    snprintf(path, sizeof path, "/proc/%ld/root", pid);
    proc_root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (proc_root < 0)
        return 0;
    root = in_root(proc_root, rootfs);
    close(proc_root);
    if (root < 0)
        return 0;
    mask = umask(0); /* the modes exact, as in Python's namespace helper (which has its own umask 0) */
    for (int i = 0; i < count && ok; i++) {
        const char *target = strchr(links[i], '=') + 1, *name;
        int fd;
        size_t path_len = (size_t)(target - 1 - links[i]);
        snprintf(dirs, sizeof dirs, "%.*s", (int)path_len, links[i]);
        *strrchr(dirs, '/') = '\0';
        name = links[i] + strlen(dirs) + 1;
        snprintf(current, sizeof current, "%.*s", (int)(target - 1 - name), name);
        fd = dir_beneath(root, dirs);
        if (fd < 0) {
            ok = 0;
            break;
        }
        {
            char found[PATH_MAX];
            ssize_t n = readlinkat(fd, current, found, sizeof found);
            if (n < 0 && errno == ENOENT)
                ok = symlinkat(target, fd, current) == 0;
            else
                ok = n >= 0 && (size_t)n == strlen(target) && memcmp(found, target, (size_t)n) == 0;
        }
        close(fd);
    }
    close(root);
    umask(mask); /* Python, if it takes over, starts with the umask this front was given */
    return ok;
}

/* Where the front does not do a hook alone once stdin is read: the resident planner, then the Python launcher. */
static void planner_or_python(const char *input, size_t len)
{
    ask_planner(input, len);
    to_python(input, len, 0);
}

/* ``oci-gpu-hook links PATH=TARGET...`` (live.run_links) where it is certain: every argument a link that
 * check_link takes (no option: split_globals would take --debug, --config, ...), the state and the bundle's
 * config.json read as above, its root.path without an escape, the pid the container; then the links.
 * Success prints nothing, in Python too.  Anything else: the planner, then the Python launcher, with stdin as it
 * came. */
static void links_main(void)
{
    char *input = NULL, bundle[PATH_MAX], path[PATH_MAX], rootfs[PATH_MAX], *spec;
    size_t len = 0, spec_len;
    struct json j = {.spec = 1};
    long pid;
    int got, ok;
    for (int i = 2; i < g_argc; i++) {
        char *eq = strchr(g_argv[i], '=');
        if (strncmp(g_argv[i], "--", 2) == 0 || !eq)
            to_python(NULL, 0, 0);
        *eq = '\0';
        ok = link_ok(g_argv[i], eq + 1);
        *eq = '=';
        if (!ok || strlen(g_argv[i]) >= PATH_MAX)
            to_python(NULL, 0, 0);
    }
    if (chdir("/") != 0)
        to_python(NULL, 0, 0);
    got = read_fd(0, &input, &len);
    if (!got) {
        say_error("cannot read stdin: %s", strerror(errno));
        _exit(1);
    }
    if (got == TOO_LARGE)
        to_python(input, len, 1);
    if (!read_state(input, len, &pid, bundle, sizeof bundle) || !config_in(path, sizeof path, bundle) ||
        !read_path(path, &spec, &spec_len))
        planner_or_python(input, len);
    j.s = spec;
    j.n = spec_len;
    if (!json_object_ok(&j))
        planner_or_python(input, len);
    if (g_argc == 2)
        _exit(0); /* no link: Python reads the config.json and stops there */
    if (!j.root_path || j.root_path_len < 3 || memchr(j.root_path, '\\', j.root_path_len) ||
        !root_path(bundle, j.root_path + 1, j.root_path_len - 2, rootfs, sizeof rootfs))
        planner_or_python(input, len);
    if (!container_ok(pid, rootfs) || !make_links(pid, rootfs, g_argv + 2, g_argc - 2))
        planner_or_python(input, len); /* also where the kernel has no openat2 (ENOSYS): Python enters by setns */
    _exit(0);
}

/* ``oci-gpu-hook ldcache ...`` (live.run_ldcache: the driver's soname links and its libraries merged into the
 * container's ld cache, which needs Python's ELF and cache readers): the resident planner serves it with its
 * arguments (its worker runs run_ldcache in a process forked from a warm interpreter: no interpreter starts),
 * else the Python launcher, with stdin as it came. */
static void ldcache_main(void)
{
    char *input = NULL, bundle[PATH_MAX];
    size_t len = 0;
    long pid;
    int got;
    if (chdir("/") != 0)
        to_python(NULL, 0, 0);
    got = read_fd(0, &input, &len);
    if (!got) {
        say_error("cannot read stdin: %s", strerror(errno));
        _exit(1);
    }
    if (got == TOO_LARGE)
        to_python(input, len, 1);
    read_state(input, len, &pid, bundle, sizeof bundle); /* the state's id names the container in the journal */
    ask_planner(input, len);
    to_python(input, len, 0);
}

int main(int argc, char **argv)
{
    char *input = NULL;
    size_t len = 0;
    int as_baked, got;
    g_argc = argc;
    g_argv = argv;
    as_baked = settings_as_baked();
    if (argc >= 2 && strcmp(argv[1], OGH_LINKS_COMMAND) == 0)
        links_main(); /* needs no config, as in Python */
    if (argc >= 2 && strcmp(argv[1], OGH_LDCACHE_COMMAND) == 0)
        ldcache_main();
    if (argc != 2 || !in_list(argv[1], OGH_HOOK_COMMANDS))
        to_python(NULL, 0, 0);
    if (chdir("/") != 0)
        to_python(NULL, 0, 0);
    got = read_fd(0, &input, &len);
    if (!got) {
        say_error("cannot read stdin: %s", strerror(errno));
        return 1;
    }
    if (got == TOO_LARGE)
        to_python(input, len, 1); /* Python reads stdin of any size: it gets all of it */
    if (as_baked && config_still_trusted()) {
        if (strcmp(argv[1], OGH_PRECREATE) == 0) {
            int devices = 0;
            read_identity();
            /* a rootless hook hands over a spec that lists devices: it checks the GPU nodes among them (CDI's) */
            if (spec_clean_devices(input, len, &devices) && !(devices && !g_privileged && g_overflow >= 0))
                return write_all(1, input, len) ? 0 : 1;
        } else if (state_clean(input, len)) {
            return 0;
        }
    }
    if (!g_container[0] && strcmp(argv[1], OGH_PRECREATE) != 0) { /* the state's id names it in the journal */
        char bundle[PATH_MAX];
        long pid;
        read_state(input, len, &pid, bundle, sizeof bundle);
    }
    ask_planner(input, len);
    to_python(input, len, 0);
    return 1;
}
#endif
