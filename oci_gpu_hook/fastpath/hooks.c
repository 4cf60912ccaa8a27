/* oci-gpu-hook native front, the hooks and the links: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/oci_state.py parse_state (read_state; state_clean: then live.py run's read of
 * BUNDLE/config.json), oci_gpu_hook/entry/cli.py cmd_precreate, oci_gpu_hook/appliers/live.py run_links and
 * check_container, oci_gpu_hook/core/edits.py check_link, oci_gpu_hook/oci_spec.py ContainerSpec.root,
 * oci_gpu_hook/appliers/rootfs.py make_nodes for links, oci_gpu_hook/core/inroot.py open_dir, FOLLOW and REFUSE
 * (in_root, dir_beneath; tests/test_inroot.py); ldcache_main: oci_gpu_hook/appliers/live.py run_ldcache (served by
 * the planner, else Python).
 */

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

#define OPENAT2_TRIES 16

static int openat2_fd(int dirfd, const char *path, int flags, unsigned long long resolve)
{
    /* EAGAIN: a rename or mount anywhere on the host raced a ".." of this walk (openat2(2)); the kernel asks the
     * caller to try again (core/inroot.py kernel_open does the same) */
    struct open_how how = {.flags = (unsigned long long)flags, .resolve = resolve};
    int fd = -1;
    for (int tries = 0; tries < OPENAT2_TRIES; tries++) {
        fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
        if (fd >= 0 || errno != EAGAIN)
            break;
    }
    return fd;
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
