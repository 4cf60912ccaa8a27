/* oci-gpu-hook native front, reading the input, and the JSON validator: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/fastjson.py loads, oci_gpu_hook/oci_spec.py loads (_pairs, _check_case), oci_spec.py
 * ContainerSpec (process_env, annotations); clean, no_request: oci_gpu_hook/request.py requested (NO_GPU;
 * oci_spec.py environ_of, annotation_names) (tests/test_fastpath_oracle.py).
 */

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

