"""The README and the manual in docs/ are the operator's manual, and every shell block in them is run, or says why
it cannot be.

The pages are ``README.md`` and every ``docs/*.md`` (:func:`pages`), all held to the same rules.  Each ``sh``
block (and each text block that starts with a ``$ `` command) has a marker on the line before it, an HTML comment
(invisible when rendered):

- ``<!-- test: node -->``: run exactly as written, with the other node blocks of every page, in one private mount
  namespace that stands for a GPU node (see :func:`node_script`): ``install`` writes its real paths there and the
  host never changes.  The order is :func:`pages`' (the README, then the pages in the order its map lists them),
  each page top to bottom;
- ``<!-- test: example -->``: run exactly as written from the checkout (as its owner), against the example
  hosts; a ``$ `` text block is run and its output compared (a ``...`` line stands for any lines);
- ``; output below`` after either: the next block (``text``) is the exact stdout; ``; output: NAME below``
  also names it, and ``; output: NAME`` expects that output again (on that page or a later one);
- ``<!-- test: ci -->``: every line is a line of ``.ci/run``, which CI runs;
- ``<!-- not run: REASON -->``: it cannot run here, and why.

An unmarked shell block, an unknown marker, or a shell block fenced as bash/shell/console fails; so do a link to a
page or section that is not there, a docs/ page the README's map does not list, and a reader's question that is not
answered within two links of the README's top.  The shipped hooks.d files, the runc prestart example, the prestart
JSON of the manual and the systemd units must name exactly what ``install`` writes; the README's example-host table
is ``examples/hosts/``, and ``docs/configuration.md`` is what :mod:`oci_gpu_hook.configdoc` generates.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oci_gpu_hook.install import items, paths
from tests.conftest import ROOT
from tests.helpers import containerlib as cl
from tests.helpers import dockersave, plainvenv, pristinenode

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
BY_PATH = "OCI_GPU_HOOK_BY_PATH_DIR"  # the session's by_path_dir (tests/conftest.py) reaches the examples
MAP_HEADING = "## The manual: `docs/`"
# The page and the heading of what the examples assume of podman (its containers.conf, read from the page).
ASSUMED = ("docs/runtimes.md", "What the examples assume")
SHELL_FENCES = {"sh"}
WRONG_SHELL_FENCES = {"bash", "shell", "console", "zsh", "shell-session"}
ENVIRONMENTS = ("node", "example", "ci")
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The node's GPUs are the seed example host's (its path inside the namespace is filled in).
NODE_CONFIG = 'sysfs_root = "{src}/examples/hosts/seed-8x-gfx1100/sys"\n'
# Overlaid in the node namespace (upper layers in the test's directory): everything install, pip and podman
# write.  /usr/share rather than /usr/share/containers, which a host may lack.
OVERLAID = ("/etc", "/usr/local", "/opt", "/usr/share", "/var")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # the comment's text
    env: str | None = None  # node, example, ci; None: not run
    reason: str | None = None
    output: str | None = None  # the exact stdout expected, when the marker says so

    page: str = "README.md"  # relative to the checkout

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def map_links(readme: str) -> list[str]:
    """The docs/ pages the README's map links, in its order (each once)."""
    lines = readme.splitlines()
    start = lines.index(MAP_HEADING) if MAP_HEADING in lines else len(lines)
    section = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        section.append(line)
    found = re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[^)]*)?\)", "\n".join(section))
    return list(dict.fromkeys(found))


def pages() -> list[str]:
    """Every page held to these rules, in the node blocks' order: the README, then the docs/ pages the map lists
    (those that exist), in its order, then any other docs/*.md by name."""
    listed = [name for name in map_links(README.read_text()) if (REPO / name).is_file()]
    others = sorted(f"docs/{path.name}" for path in DOCS.glob("*.md") if f"docs/{path.name}" not in listed)
    return ["README.md", *listed, *others]


def parse(text: str, page: str = "README.md", outputs: dict[str, str] | None = None) -> tuple[list[Block], list[str]]:
    """Every fenced block of one page with its marker, and the problems with the markers.  ``outputs`` carries the
    named outputs shown on earlier pages, and takes this page's."""
    lines = text.splitlines()
    raw: list[Block] = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        comment = re.match(r"^<!--\s*(.*?)\s*-->$", lines[before].strip()) if before >= 0 else None
        raw.append(Block(i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n",
                         comment.group(1) if comment else None, page=page))
        i = end + 1
    problems: list[str] = []
    blocks: list[Block] = []
    outputs = {} if outputs is None else outputs  # "output: NAME below" shows one; "output: NAME" expects it again
    skip = set()
    for n, block in enumerate(raw):
        if n in skip:
            continue
        blocks.append(block)
        shell = block.lang in SHELL_FENCES or (block.lang in ("", "text") and block.text.startswith("$ "))
        if block.lang in WRONG_SHELL_FENCES:
            problems.append(f"{block.where()}: a shell block is fenced ```sh, not ```{block.lang}")
            continue
        if not shell:
            continue
        if block.marker is None:
            problems.append(f"{block.where()}: a shell block without a marker (<!-- test: node|example|ci --> "
                            "or <!-- not run: REASON -->) on the line before it")
            continue
        if block.marker.startswith("not run:"):
            block.reason = block.marker.removeprefix("not run:").strip()
            if len(block.reason) < 10:
                problems.append(f"{block.where()}: 'not run' needs its reason")
            continue
        test = re.fullmatch(r"test:\s*(\w+)\s*(?:;\s*output(?::\s*([\w-]+))?(\s+below)?)?", block.marker)
        if not test or test.group(1) not in ENVIRONMENTS or (";" in block.marker and not (test.group(2) or
                                                                                         test.group(3))):
            problems.append(f"{block.where()}: unknown marker <!-- {block.marker} -->")
            continue
        block.env, name, below = test.group(1), test.group(2), bool(test.group(3))
        if below:
            following = raw[n + 1] if n + 1 < len(raw) else None
            if following is None or following.lang != "text" or following.line - block.line > \
                    block.text.count("\n") + 3:
                problems.append(f"{block.where()}: 'output below' but no ```text block right after it")
                continue
            block.output = following.text
            if name:
                outputs[name] = following.text
            skip.add(n + 1)
            blocks.append(following)
        elif name:
            if name not in outputs:
                problems.append(f"{block.where()}: 'output: {name}' but no output of that name is shown above it")
            block.output = outputs.get(name)
        if block.env == "ci" and block.output is not None:
            problems.append(f"{block.where()}: a ci block has no output to compare")
        if block.env != "example" and block.text.startswith("$ "):
            problems.append(f"{block.where()}: a '$ ' transcript runs only as an example block")
    return blocks, problems


def parse_pages() -> tuple[list[Block], list[str]]:
    """The blocks of every page, in :func:`pages`' order, and every problem with their markers."""
    blocks: list[Block] = []
    problems: list[str] = []
    outputs: dict[str, str] = {}
    for page in pages():
        found, wrong = parse((REPO / page).read_text(), page, outputs)
        blocks += found
        problems += wrong
    return blocks, problems


def all_blocks() -> list[Block]:
    return parse_pages()[0]


def shell_blocks(env: str) -> list[Block]:
    return [b for b in all_blocks() if b.env == env]


def page_texts() -> dict[str, str]:
    return {page: (REPO / page).read_text() for page in pages()}


def containers_conf() -> str:
    """The containers.conf that the manual says the podman examples assume (the node namespace's)."""
    page, heading = ASSUMED
    text = (REPO / page).read_text()
    section = text[text.index(f"## {heading}\n"):]
    return re.search(r"^```toml\n(.*?)^```$", section, re.M | re.S).group(1)  # type: ignore[union-attr]


# --- the markers ------------------------------------------------------------------------------------------


def test_every_shell_block_is_run_or_says_why() -> None:
    blocks, problems = parse_pages()
    assert problems == []
    shell = [b for b in blocks if b.env or b.reason]
    assert {b.env for b in shell} >= {"node", "example", "ci", None}
    not_run = [b for b in shell if b.reason]
    assert len(not_run) <= len(shell) // 3, "most blocks must run"


@pytest.mark.parametrize(("text", "problem"), [
    ("```sh\nls\n```\n", "a shell block without a marker"),
    ("<!-- test: somewhere -->\n```sh\nls\n```\n", "unknown marker <!-- test: somewhere -->"),
    ("<!-- not run: -->\n```sh\nls\n```\n", "'not run' needs its reason"),
    ("<!-- test: node -->\n```bash\nls\n```\n", "fenced ```sh, not ```bash"),
    ("```\n$ oci-gpu-hook list\nKIND\n```\n", "a shell block without a marker"),
    ("<!-- test: node; output below -->\n```sh\nls\n```\n\nText.\n", "no ```text block right after it"),
    ("<!-- test: node; output: gpu1 -->\n```sh\nls\n```\n", "no output of that name is shown above it"),
    ("<!-- test: node; outputs -->\n```sh\nls\n```\n", "unknown marker"),
    ("<!-- test: ci; output below -->\n```sh\nls\n```\n```text\nx\n```\n", "a ci block has no output to compare"),
], ids=["unmarked", "unknown", "no-reason", "bash", "transcript", "no-output", "nothing-above", "bad-output",
        "ci-output"])
def test_the_checker_refuses(text: str, problem: str) -> None:
    problems = parse("Intro.\n\n" + text)[1]
    assert len(problems) >= 1 and problem in problems[0], problems


def test_ci_blocks_are_what_ci_runs() -> None:
    ci_lines = {line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()}
    for block in shell_blocks("ci"):
        for line in block.text.splitlines():
            assert line.strip() in ci_lines, f"{block.where()}: {line!r} is not a line of .ci/run"


# --- example blocks: from the checkout ---------------------------------------------------------------------


def matches(expected: list[str], actual: list[str]) -> bool:
    """``expected`` equals ``actual``, a line '...' standing for any run of lines (none included)."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def as_checkout_owner() -> tuple[dict[str, Any], int]:
    """subprocess keywords that run a command as the checkout's owner (root runs it for a user's checkout)."""
    owner = REPO.stat().st_uid
    if not ROOT or owner == 0:
        return {}, os.geteuid()
    gid = REPO.stat().st_gid
    return {"user": owner, "group": gid, "extra_groups": []}, owner


@pytest.mark.parametrize("block", shell_blocks("example"), ids=lambda b: b.where())
def test_example_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if not (REPO / ".venv" / "bin" / "oci-gpu-hook").exists():
        pytest.fail("no .venv in the checkout: make it as the README says (python3 -m venv .venv ...)")
    as_owner, uid = as_checkout_owner()
    os.chown(tmp_path, uid, -1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_GPU_HOOK_") or k == BY_PATH}
    env["TMPDIR"] = str(tmp_path)  # mktemp's directory: the test's own
    if block.text.startswith("$ "):
        command, *expected = block.text.splitlines()
        done = subprocess.run(["sh", "-e", "-c", command[2:]], capture_output=True, text=True, cwd=REPO, env=env,
                              timeout=120, check=False, **as_owner)
        assert done.returncode == 0, done.stderr
        actual = [line.rstrip() for line in done.stdout.splitlines()]
        assert matches([line.rstrip() for line in expected], actual), done.stdout
        return
    done = subprocess.run(["sh", "-e", "-c", block.text], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300, check=False, **as_owner)
    assert done.returncode == 0, f"{block.where()}:\n{block.text}\n{done.stderr}"
    if block.output is not None:
        assert done.stdout == block.output


# --- node blocks: a GPU node in a private mount namespace --------------------------------------------------


def node_script(base: Path, blocks: list[Block]) -> str:
    """The namespace, then each block as written (cwd: a fresh copy of the tree), its stdout, stderr and
    status kept in ``base`` (bind-mounted at /run/ogh-readme, since /tmp becomes a tmpfs)."""
    lines = ["set -e"]
    for n, target in enumerate((*OVERLAID, os.path.expanduser("~"))):
        upper, work = base / "ovl" / f"u{n}", base / "ovl" / f"w{n}"
        upper.mkdir(parents=True)
        work.mkdir(parents=True)
        lines.append(f"mount -t overlay overlay -o lowerdir={target},upperdir={upper},workdir={work} {target}")
    lines += [
        "mkdir -p /var/lib/containers && mount -t tmpfs tmpfs /var/lib/containers",  # podman's storage
        "mount -t tmpfs tmpfs /run",
        f"mkdir /run/ogh-readme && mount --bind {base} /run/ogh-readme",
        "mount -t tmpfs tmpfs /tmp",
        *pristinenode.take_back_lines(OVERLAID),  # a node before install, also where this machine is one
        # a podman node, as the examples' env requests need: where containerd's CRI or CRI-O serves pods (Debian's
        # containerd package ships a config with the CRI on), install bakes env requests off (docs/security.md)
        "rm -rf /etc/containerd /etc/crio",
        "W=/run/ogh-readme",
        "mkdir -p /etc/oci-gpu-hook /etc/containers",
        "cp $W/config.toml /etc/oci-gpu-hook/config.toml",
        "cp $W/containers.conf /etc/containers/containers.conf",
        "podman load -q -i $W/busybox.tar > $W/load.out 2>&1",
        "set +e",
    ]
    for n, _block in enumerate(blocks):
        lines.append(f"(cd $W/src && exec sh -e $W/block.{n}.sh) > $W/out.{n} 2> $W/err.{n}; echo $? > $W/rc.{n}")
    return "\n".join(lines) + "\n"


@pytest.mark.containers
def test_node_blocks_run_as_written(tmp_path: Path) -> None:
    cl.need("podman", "runc", "unshare", "tar")
    blocks = shell_blocks("node")
    base = tmp_path / "node"
    base.mkdir()
    plainvenv.copy_tree(base / "src")
    (base / "config.toml").write_text(NODE_CONFIG.format(src="/run/ogh-readme/src"))
    (base / "containers.conf").write_text(containers_conf())
    rootfs = cl.make_rootfs(tmp_path / "rootfs")
    dockersave.build(rootfs, base / "busybox.tar", "docker.io/library/busybox:latest")
    for n, block in enumerate(blocks):
        (base / f"block.{n}.sh").write_text(block.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_GPU_HOOK_") or k == BY_PATH}
    env.update(PATH=ROOT_PATH, HOME=os.path.expanduser("~"))
    host_paths = ["/opt/oci-gpu-hook", "/usr/local/bin/oci-gpu-hook", "/usr/local/libexec/oci-gpu-hook",
                  "/var/lib/oci-gpu-hook", "/var/run/cdi", "/etc/oci-gpu-hook", "/tmp/gpu1", "/tmp/stage"]
    before = {path: os.path.lexists(path) for path in host_paths}
    done = subprocess.run(["unshare", "-m", "sh", "-c", node_script(base, blocks)], capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    failures = []
    for n, block in enumerate(blocks):
        rc = (base / f"rc.{n}").read_text().strip()
        out, err = (base / f"out.{n}").read_text(), (base / f"err.{n}").read_text()
        if rc != "0":
            failures.append(f"{block.where()} exited {rc}:\n{block.text}--- stderr:\n{err[-3000:]}")
        elif block.output is not None and out != block.output:
            failures.append(f"{block.where()} printed:\n{out}--- expected:\n{block.output}")
    assert not failures, "\n\n".join(failures)
    assert {path: os.path.lexists(path) for path in host_paths} == before  # the host never changed


# --- what the shipped files name is what install writes -------------------------------------------------


HOOK = f"{paths.LAUNCHER_DIR}/oci-gpu-hook"


@pytest.mark.parametrize("stage", paths.HOOK_STAGES)
def test_shipped_hooks_d_files_are_what_install_writes(stage: str) -> None:
    shipped = (REPO / "hooks.d" / f"oci-gpu-hook-{stage}.json").read_text()
    assert json.loads(shipped) == json.loads(items.hook_file(stage, HOOK))
    assert json.loads(shipped)["hook"]["path"] == HOOK
    assert items.HOOK_TEMPLATE["hook"]["path"] == HOOK


def test_the_runc_prestart_example_and_the_manual_name_the_installed_launcher() -> None:
    spec = json.loads((REPO / "examples" / "runc-prestart" / "config.json").read_text())
    template = items.hook_template("prestart")["hook"]
    assert spec["hooks"] == {"prestart": [template]}
    snippet = next(b for b in all_blocks() if b.lang == "json" and '"prestart"' in b.text)
    assert json.loads("{" + snippet.text + "}")["hooks"] == spec["hooks"]


def test_the_systemd_unit_is_what_install_writes() -> None:
    shipped = (REPO / "examples" / "systemd" / "oci-gpu-hook-watch.service").read_text()
    assert items.unit_file(HOOK) == shipped
    planner = (REPO / "examples" / "systemd" / "oci-gpu-hook-planner.service").read_text()
    assert items.unit_file(HOOK, paths.PLANNER_UNIT) == planner
    exec_lines = [line for line in shipped.splitlines() if line.startswith(("ExecStart=", "ExecStartPre="))]
    assert exec_lines and all(HOOK in line for line in exec_lines)


def test_every_launcher_path_in_the_pages_is_one_install_writes() -> None:
    text = "\n".join(page_texts().values())
    named = set(re.findall(r"/usr/local/libexec/oci-gpu-hook/[\w.-]+", text))
    assert named <= {HOOK, f"{paths.LAUNCHER_DIR}/oci-gpu-runtime"}, named
    assert "/usr/local/bin/oci-gpu-hook\"" not in text  # a hook path nothing installs


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of ``markdown``'s headings (fenced blocks hold no headings)."""
    outside_fences = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return {slug(heading) for heading in re.findall(r"^#+ (.*)$", outside_fences, re.M)}


def links(markdown: str) -> list[str]:
    """The targets of ``markdown``'s links outside fenced blocks, as written."""
    outside_fences = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return re.findall(r"\]\(([^)\s]+)\)", outside_fences)


def resolve(page: str, target: str) -> tuple[str, str | None] | None:
    """A link of ``page`` as (the file relative to the checkout, the anchor or None); None for one that leaves the
    checkout (a URL)."""
    if re.match(r"^[a-z]+:", target):
        return None
    path, _, anchor = target.partition("#")
    name = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
    return name, anchor or None


def dead_links(texts: dict[str, str]) -> list[str]:
    """Every link of these pages to a file that is not there, or to a section its page does not have."""
    dead = []
    for page, text in texts.items():
        for target in links(text):
            where = resolve(page, target)
            if where is None:
                continue
            name, anchor = where
            if name.startswith(".."):
                dead.append(f"{page}: {target}: outside the checkout")
            elif not (REPO / name).exists():
                dead.append(f"{page}: {target}: no such file")
            elif anchor and name.endswith(".md") and anchor not in anchors((REPO / name).read_text()):
                dead.append(f"{page}: {target}: no such section")
    return dead


def test_every_link_names_a_file_and_a_section() -> None:
    """Also the map's links to pages written on other branches (docs/dra.md, docs/image.md): dead until they come."""
    texts = page_texts()
    assert sum(len(links(text)) for text in texts.values()) > 50
    assert dead_links(texts) == []


def test_the_link_checker_finds_dead_links() -> None:
    texts = {"README.md": "[a](docs/absent-page.md), [b](#no-such-heading), [c](docs/runtimes.md#no-such), "
                          "[d](https://example.org/x), [e](#the-manual-docs)\n\n## The manual: `docs/`\n"}
    assert dead_links(texts) == ["README.md: docs/absent-page.md: no such file",
                                 "README.md: #no-such-heading: no such section",
                                 "README.md: docs/runtimes.md#no-such: no such section"]


def test_the_map_lists_every_page() -> None:
    listed = map_links(README.read_text())
    assert len(listed) == len(set(listed))
    on_disk = {f"docs/{path.name}" for path in DOCS.glob("*.md")}
    assert on_disk - set(listed) == set(), "docs/ pages the README's map does not list"
    # the pages other work brings: linked even before they are here
    assert {"docs/dra.md", "docs/image.md", "docs/hardware.md", "docs/configuration.md"} <= set(listed)


def test_the_node_order_is_the_maps() -> None:
    order = pages()
    assert order[0] == "README.md"
    assert order.index("docs/runtimes.md") < order.index("docs/how-it-works.md")  # its bundle /tmp/gpu1 is reused
    assert set(order) == {"README.md", *(f"docs/{path.name}" for path in DOCS.glob("*.md"))}


# What a newcomer comes for, and the section of the page that answers it.
QUESTIONS = {
    "install on a node": ("README.md", "install-on-a-node"),
    "one GPU container": ("README.md", "one-gpu-container-per-runtime"),
    "run the tests": ("README.md", "run-the-tests"),
    "a refusal's cause": ("docs/troubleshooting.md", "where-a-refusal-shows"),
    "a setting": ("docs/configuration.md", "hook_path"),
    "a runtime's own path": ("docs/runtimes.md", "docker"),
    "the request grammar": ("docs/requests.md", "the-grammar-amd-and-intel"),
}


def within_two_links() -> set[tuple[str, str | None]]:
    """Every (page, anchor) a reader reaches from the README's top in at most two clicks (any link of a page
    reached counts, wherever on it)."""
    reached: set[tuple[str, str | None]] = {("README.md", None)}
    frontier = {"README.md"}
    for _click in range(2):
        step = set()
        for page in frontier:
            if not (REPO / page).is_file() or not page.endswith(".md"):
                continue
            for target in links((REPO / page).read_text()):
                where = resolve(page, target)
                if where is not None:
                    step.add(where)
        reached |= step
        frontier = {name for name, _anchor in step}
    return reached


@pytest.mark.parametrize("question", list(QUESTIONS))
def test_each_question_is_answered_within_two_links_of_the_top(question: str) -> None:
    page, anchor = QUESTIONS[question]
    assert anchor in anchors((REPO / page).read_text()), f"{page} has no section #{anchor}"
    assert (page, anchor) in within_two_links(), f"{question}: {page}#{anchor} is not two links from the README's top"


def test_every_setting_is_two_links_from_the_top() -> None:
    from oci_gpu_hook.config import FIELDS

    reached = within_two_links()
    assert [key for key in FIELDS if ("docs/configuration.md", key) not in reached] == []


def test_the_test_command_is_near_the_top() -> None:
    """The one command that runs the tests is in the README's first screen or so, and is what CI runs."""
    lines = README.read_text().splitlines()
    at = lines.index(".venv/bin/python -m pytest -q")
    assert at < 60, at
    assert "## Run the tests" in lines[:at]


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    intro = text[:text.index("\n## ")]
    assert all(vendor in intro for vendor in ("AMD", "Intel", "NVIDIA", "MIG", "partition"))


def test_no_sudo_in_the_pages() -> None:
    """The commands are written as root runs them: `sudo` fails where there is none (CI containers)."""
    assert [page for page, text in page_texts().items() if re.search(r"\bsudo\b", text)] == []


def test_fakesysfs_usage_is_what_the_pages_say() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.helpers.fakesysfs"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m tests.helpers.fakesysfs DIR [seed-8x-gfx1100|")
    assert all("`python -m tests.helpers.fakesysfs DIR [HOST]`" in (REPO / page).read_text()
               for page in ("README.md", "docs/development.md"))


def test_ci_run_says_to_run_it_as_root() -> None:
    """`.ci/run` from a user's shell stops at once with what to do (it would need root for apt-get and containers)."""
    as_user: dict[str, Any] = {"user": 65534, "group": 65534, "extra_groups": []} if ROOT else {}
    done = subprocess.run([str(REPO / ".ci" / "run")], capture_output=True, text=True, timeout=60, check=False,
                          cwd="/", env={"PATH": ROOT_PATH}, **as_user)
    assert done.returncode == 1
    assert done.stderr == (".ci/run: run it as root (it installs Debian packages and starts real containers), "
                           "e.g. from a root shell\n")
    assert done.stdout == ""


def test_the_containers_conf_the_examples_assume_is_toml_for_runc() -> None:
    conf = tomllib.loads(containers_conf())
    assert conf["engine"]["runtime"] == "runc" and conf["engine"]["cgroup_manager"] == "cgroupfs"


# --- the tables: docs/configuration.md is generated from config.FIELDS, the example hosts are examples/hosts/ ----


def table(header: str, text: str | None = None) -> list[list[str]]:
    """The rows (cells stripped) of the table whose header line is ``header`` (in the README by default)."""
    lines = (README.read_text() if text is None else text).splitlines()
    start = lines.index(header) + 2  # after the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_configuration_page_is_generated_from_fields() -> None:
    from oci_gpu_hook import configdoc

    assert (DOCS / "configuration.md").read_text() == configdoc.page(), \
        "regenerate it: .venv/bin/python -m oci_gpu_hook.configdoc > docs/configuration.md"


def test_the_configuration_module_writes_the_page() -> None:
    done = subprocess.run([sys.executable, "-m", "oci_gpu_hook.configdoc"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == (DOCS / "configuration.md").read_text()


def test_the_configuration_table_is_what_the_loader_takes() -> None:
    """Each default, read back as the TOML it is written in, is what the loader makes of it: the key's default."""
    from oci_gpu_hook import configdoc
    from oci_gpu_hook.config import FIELDS, check_value

    seen = []
    for key_cell, default_cell, env_cell in table("| key | default | env |", (DOCS / "configuration.md").read_text()):
        key = re.fullmatch(r"\[`([a-z_]+)`\]\(#([a-z_]+)\)", key_cell)
        assert key and key.group(1) == key.group(2), key_cell
        name = key.group(1)
        written = re.fullmatch(r"`(.*)`", default_cell)
        assert written, default_cell
        value = tomllib.loads(f"{name} = {written.group(1)}")[name]
        loaded = check_value(name, value, "docs/configuration.md")
        default = FIELDS[name].default
        assert (list(loaded) if isinstance(loaded, tuple) else loaded) == \
            (list(default) if isinstance(default, tuple) else default), name
        assert env_cell == (f"`{FIELDS[name].env}`" if FIELDS[name].env else ""), name
        seen.append(name)
    assert seen == list(FIELDS)  # every key, once, in the definition's order
    assert set(configdoc.SEE) <= set(FIELDS)


def test_the_example_host_table_is_examples_hosts() -> None:
    hosts = [re.fullmatch(r"`([^`]+)`", row[0]) for row in table("| host | what it is |")]
    assert all(hosts), hosts
    named = [h.group(1) for h in hosts if h]
    assert sorted(named) == sorted(p.name for p in (REPO / "examples" / "hosts").iterdir() if p.is_dir())
    assert len(set(named)) == len(named)
