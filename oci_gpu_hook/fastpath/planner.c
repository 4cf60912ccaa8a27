/* oci-gpu-hook native front, the planner client: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/serve/planner/protocol.py read_request, encode_answer (the protocol), planner/worker.py
 * run_entry (what the answer holds); exec_path: entry/runtime.py main's execv (after prepare)
 * (tests/test_planner_oracle.py).
 */

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

/* The planner (oci_gpu_hook/serve/planner/, `oci-gpu-hook serve`) answers what the Python launcher would
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

#define PLANNER_FDS 6 /* the namespaces (mnt, pid, cgroup, user), the root, the working directory */

/* OGH_PLANNER_TIMEOUT_MS from now, on the monotonic clock */
static void planner_deadline(struct timespec *deadline)
{
    clock_gettime(CLOCK_MONOTONIC, deadline);
    deadline->tv_sec += OGH_PLANNER_TIMEOUT_MS / 1000;
    deadline->tv_nsec += (OGH_PLANNER_TIMEOUT_MS % 1000) * 1000000L;
    if (deadline->tv_nsec >= 1000000000L) {
        deadline->tv_sec++;
        deadline->tv_nsec -= 1000000000L;
    }
}

/* The descriptors the request carries, opened in order; 0 where one cannot be (*nfds: those open, to close) */
static int planner_fds(int *fds, int *nfds)
{
    static const char *const namespaces[] = {"/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/cgroup",
                                             "/proc/self/ns/user", NULL};
    for (; namespaces[*nfds]; (*nfds)++)
        if ((fds[*nfds] = open(namespaces[*nfds], O_RDONLY | O_CLOEXEC)) < 0)
            return 0;
    if ((fds[*nfds] = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        return 0;
    (*nfds)++;
    if ((fds[*nfds] = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        return 0;
    (*nfds)++;
    return 1;
}

/* The request (protocol.py read_request), its length filled in last; 0 where it could not be built */
static int planner_request(struct out *req, const char *input, size_t len)
{
    mode_t mask = umask(0);
    size_t count = 0, body;
    umask(mask);
    out_bytes(req, "OGHQ\0\0\0\0", 8); /* the length goes in last */
    out_str(req, OGH_PLANNER_VERSION);
    out_str(req, OGH_ROLE_NAME);
    out_str(req, OGH_SELF);
    out_str(req, OGH_ROLE == OGH_ROLE_SHIM ? OGH_RUNTIME : ""); /* the runtime the Python launcher has baked */
    out_num(req, (long)getppid());
    out_num(req, (long)mask);
    out_num(req, (long)prctl(PR_GET_SECUREBITS, 0, 0, 0, 0));
    out_u32(req, g_argc > 1 ? (size_t)g_argc - 1 : 0);
    for (int i = 1; i < g_argc; i++)
        out_str(req, g_argv[i]);
    for (char **e = environ; *e; e++)
        count++;
    out_u32(req, count);
    for (char **e = environ; *e; e++)
        out_str(req, *e);
    out_str(req, input ? "1" : "0");
    out_field(req, input ? input : "", input ? len : 0);
    if (req->failed)
        return 0;
    body = req->n - 8;
    req->p[4] = (char)(body >> 24);
    req->p[5] = (char)(body >> 16);
    req->p[6] = (char)(body >> 8);
    req->p[7] = (char)body;
    return 1;
}

/* The request's first 8 bytes with the descriptors, then the rest within the deadline; 0 where it failed */
static int planner_send(int sock, const struct out *req, const int *fds, const struct timespec *deadline)
{
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(PLANNER_FDS * sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = req->p, .iov_len = 8};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                         .msg_controllen = sizeof control.bytes};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(PLANNER_FDS * sizeof(int));
    memcpy(CMSG_DATA(c), fds, PLANNER_FDS * sizeof(int));
    if (sendmsg(sock, &msg, MSG_NOSIGNAL) != 8)
        return 0;
    return send_all(sock, req->p + 8, req->n - 8, deadline);
}

/* The exchange up to STARTED: the request sent, READY (else a refusal, or nothing in time: Python), GO while
 * inside the bound, then STARTED.  1 once the planner has started the request; 0 to fall back (*answered: it
 * handed the request back). */
static int planner_exchange(int sock, const char *input, size_t len, const int *fds,
                            const struct timespec *deadline, int *answered)
{
    struct out req = {0};
    char header[4];
    int sent = planner_request(&req, input, len) && planner_send(sock, &req, fds, deadline);
    free(req.p);
    if (!sent || !recv_all(sock, header, 4, deadline))
        return 0;
    *answered = memcmp(header, "OGHR", 4) != 0; /* its refusal: handed back before it did anything */
    return !(*answered || ms_left(deadline) <= 0 || !send_all(sock, "OGHG", 4, deadline) ||
             !recv_all(sock, header, 4, NULL) || memcmp(header, "OGHS", 4) != 0);
}

/* The planner began and did not finish: what it did is not done twice. */
__attribute__((noreturn)) static void planner_unfinished(void)
{
    say_error("the resident planner did not finish this request (it is not run again; see the planner's log): "
              "start the container again");
    _exit(1);
}

/* After STARTED: the answer written out, then exit with its status or exec the runtime it names; the one error
 * line where the answer is missing or wrong.  Returns only where its fields cannot be taken apart: Python. */
static void planner_answer(int sock)
{
    char header[8], *answer;
    size_t body;
    if (!recv_all(sock, header, sizeof header, NULL) || memcmp(header, "OGHA", 4) != 0)
        planner_unfinished();
    body = get_u32(header + 4);
    if (body > OGH_PLANNER_MAX_ANSWER || !(answer = malloc(body ? body : 1)) || !recv_all(sock, answer, body, NULL))
        planner_unfinished();
    const char *at = answer, *end = answer + body, *f[7];
    size_t n[7];
    long code = 0;
    for (int i = 0; i < 7; i++)
        if (!take(&at, end, &f[i], &n[i])) {
            free(answer);
            return;
        }
    /* version, status, exit status, runtime to exec, an environment entry for it, stdout, stderr */
    if (at != end || !span_is(f[0], n[0], OGH_PLANNER_VERSION) || !span_is(f[1], n[1], "ok") || !n[2] ||
        n[2] > 3 || n[3] >= PATH_MAX || memchr(f[3], '\0', n[3]) || memchr(f[4], '\0', n[4]))
        planner_unfinished();
    for (size_t k = 0; k < n[2]; k++) {
        if (!isdigit((unsigned char)f[2][k]))
            planner_unfinished();
        code = code * 10 + (f[2][k] - '0');
    }
    if (code > 255)
        planner_unfinished();
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

/* Ask the planner (see above): returns only when the front is to fall back to the Python launcher. */
static void ask_planner(const char *input, size_t len)
{
    const char *socket_path = getenv(OGH_PLANNER_ENV);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timespec deadline;
    struct ucred cred;
    socklen_t cred_len = sizeof cred;
    int fds[PLANNER_FDS], nfds = 0, sock = -1, answered = 0;
    if (!socket_path)
        socket_path = OGH_PLANNER_SOCKET;
    if (socket_path[0] != '/' || strlen(socket_path) >= sizeof addr.sun_path)
        return;
    check_trust(); /* what to_python refuses, the planner does not do either */
    read_identity();
    if (!g_privileged || !planner_dir_ok(socket_path))
        return; /* the planner acts as root: a front without root's privilege (rootless podman's hook) runs alone */
    planner_deadline(&deadline);
    strcpy(addr.sun_path, socket_path);
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    /* absent, refused, or its backlog full (EAGAIN); not root's; a descriptor that cannot be opened: Python */
    if (sock >= 0 && connect(sock, (struct sockaddr *)&addr, sizeof addr) == 0 &&
        getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 && cred.uid == 0 &&
        planner_fds(fds, &nfds) && planner_exchange(sock, input, len, fds, &deadline, &answered))
        planner_answer(sock);
    planner_handover(socket_path, sock, answered, &deadline);
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

