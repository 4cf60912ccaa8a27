/* oci-gpu-hook native front, the journal's line and the one error line: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/log.py to_syslog (syslog_message, syslog_text), with the config's syslog as baked
 * (tests/test_journal.py holds syslog_text to it byte for byte).
 */

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

