/* oci-gpu-hook native front: the part of a launcher that runs without Python.
 *
 * Built by `oci-gpu-hook launchers` / `install` with the system C compiler, once per launcher, with
 * the settings of that install baked in (a generated header, see oci_gpu_hook/fastpath/build.py).
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
 * oci_gpu_hook/fastpath/build.py front_contract takes each from where Python defines it and bakes it as OGH_<KEY>
 * (the bool words and variables, the config and runtime variables, the rewrite and hook commands, the links
 * command, its directory and node names, the default PATH, the planner's socket, variable and bound); the
 * request names and "cdi.k8s.io" are OGH_NEEDLES and the request names as spelled OGH_REQUEST_NAMES (build.py
 * baked_settings), the words that ask for nothing OGH_NO_REQUEST_WORDS (front_contract, from request.py NO_GPU),
 * the config.json field names OGH_FIELD_NAMES (oci_spec.py _FIELDS), the planner's version line
 * OGH_PLANNER_VERSION (planner/protocol.py version_line).
 *
 * The Python each part mirrors:
 *   settings_as_baked   oci_gpu_hook/config.py load_config (env values: check_value of the bool fields),
 *                       the launcher's os.environ.setdefault of the baked defaults,
 *                       oci_gpu_hook/fastpath/build.py baked_settings (the config bytes baked)
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
 *   ask_planner         oci_gpu_hook/serve/planner/protocol.py read_request, encode_answer (the protocol),
 *                       planner/worker.py run_entry
 *                       (what the answer holds); exec_path: entry/runtime.py main's execv (after prepare)
 *   untrusted           the TRUST check of oci_gpu_hook/install/launchers.py (trust.py code_problem)
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
static const char *g_python_reason; /* why every container goes to Python (settings_as_baked): the journal line */
static char g_container[129]; /* the container the input names (the shim's argv, the state's id), for the journal */

/* log.py to_syslog's ``container``: the first 128 bytes of the name the input gives */
static void note_container(const char *name, size_t n)
{
    if (n >= sizeof g_container)
        n = sizeof g_container - 1;
    memcpy(g_container, name, n);
    g_container[n] = '\0';
}

/* The parts, in this order (each names at its top the Python it must agree with); build.py FRONT_PARTS. */
#include "journal.c"
#include "trust.c"
#include "json.c"
#include "settings.c"
#include "planner.c"
#include "argv.c"
#include "hooks.c"
