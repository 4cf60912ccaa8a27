"""The one model of device cgroup semantics.

Three readings of a rule list exist in the wild, and all of them live here:

* :class:`Policy` is runc's emulator (``devices_emulator.go``), which is also the
  kernel's cgroup v1 semantics: start from deny-all, apply the rules in order; a
  rule of type ``a`` resets the whole policy to allow-all or deny-all, any other
  rule adds an exception to (or removes one from) the default.  This is how runc
  reads ``linux.resources.devices``, writes cgroup v1 and generates its cgroup v2
  program; :meth:`Policy.allows` is the kernel's v1 check (an exception must
  cover every requested access bit in default-deny mode; any overlap denies in
  default-allow mode).  Like runc, it refuses to punch a hole into a wildcard
  exception (``deny c 226:* rwm`` in default-allow mode, then ``allow c 226:1``):
  cgroup v1 would silently ignore that, runc refuses the container.
* :func:`first_match` is an eBPF device program's semantics in runc's format:
  the first rule that matches the device and whose access holds every requested
  bit decides; none matches: deny.
* :func:`grants` answers "does this policy already let the container use this node?"
  for either of the two.
"""

from __future__ import annotations

from oci_gpu_hook.core.devices import ACCESS_ORDER, Rule
from oci_gpu_hook.errors import HookError

TYPE_CHECKING = False  # not typing's: see oci_gpu_hook/startpath.py

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


def _bits(access: str) -> set[str]:
    return set(access)


class Policy:
    """runc's device emulator: a default verdict and exceptions keyed by (type, major, minor)."""

    __slots__ = ("default_allow", "exceptions")

    def __init__(self, default_allow: bool = False) -> None:
        self.default_allow = default_allow
        self.exceptions: dict[tuple[str, int | None, int | None], str] = {}

    @classmethod
    def of(cls, rules: Iterable[Rule], default_allow: bool = False) -> Policy:
        policy = cls(default_allow)
        for rule in rules:
            policy.apply(rule)
        return policy

    def copy(self) -> Policy:
        other = Policy(self.default_allow)
        other.exceptions = dict(self.exceptions)
        return other

    @property
    def allows_everything(self) -> bool:
        return self.default_allow and not self.exceptions

    def apply(self, rule: Rule) -> None:
        """Apply one rule as runc's emulator does; a HookError where runc would refuse it."""
        if rule.type == "a":  # the kernel resets on type a, whatever numbers and access come with it
            self.default_allow = rule.allow
            self.exceptions = {}
            return
        if rule.allow == self.default_allow:
            self._remove(rule)
        else:
            key = (rule.type, rule.major, rule.minor)
            old = self.exceptions.get(key, "")
            self.exceptions[key] = "".join(c for c in ACCESS_ORDER if c in old or c in rule.access)

    def _remove(self, rule: Rule) -> None:
        key = (rule.type, rule.major, rule.minor)
        for (kind, major, minor), access in self.exceptions.items():
            if (kind, major, minor) == key:
                continue
            if (kind == rule.type and (major is None or major == rule.major) and (minor is None or minor == rule.minor)
                    and _bits(access) & _bits(rule.access)):
                shown = Rule(not self.default_allow, kind, major, minor, access)
                raise HookError(f"the device rule '{'allow' if rule.allow else 'deny'} {rule.v1_line()}' would punch "
                                f"a hole in the wildcard rule '{'allow' if shown.allow else 'deny'} {shown.v1_line()}' "
                                "of the container's config; runc refuses that (cgroup v1 cannot express it)")
        old = self.exceptions.get(key)
        if old is not None:
            left = "".join(c for c in old if c not in rule.access)
            if left:
                self.exceptions[key] = left
            else:
                del self.exceptions[key]

    def allows(self, type: str, major: int, minor: int, access: str) -> bool:
        """The kernel's cgroup v1 check for an access to ``type major:minor``."""
        wanted = _bits(access)
        for (kind, ex_major, ex_minor), ex_access in self.exceptions.items():
            if kind != type or (ex_major is not None and ex_major != major) or (
                    ex_minor is not None and ex_minor != minor):
                continue
            if self.default_allow:
                if wanted & _bits(ex_access):
                    return False
            elif wanted <= _bits(ex_access):
                return True
        return self.default_allow

    def grant(self, rules: Iterable[Rule]) -> list[Rule]:
        """The allow ``rules`` of a grant that this policy does not allow yet, as runc would read them appended to
        the container's list: a HookError where runc would refuse that list (a hole in a wildcard rule).  The one
        answer to "would runc refuse this grant" for every applier; ``self`` is left as it was."""
        missing = [rule for rule in rules if not grants(self.allows, rule)]
        trial = self.copy()
        for rule in missing:
            trial.apply(rule)
        return missing

    def rules(self) -> list[Rule]:
        """The policy as a rule list that rebuilds it: the reset, then the exceptions (sorted)."""
        out = [Rule(self.default_allow, "a", None, None, "rwm")]
        for (kind, major, minor), access in sorted(self.exceptions.items(),
                                                   key=lambda item: (item[0][0], _num(item[0][1]), _num(item[0][2]))):
            out.append(Rule(not self.default_allow, kind, major, minor, access))
        return out


def _num(value: int | None) -> int:
    return -1 if value is None else value


def first_match(rules: Iterable[Rule], type: str, major: int, minor: int, access: str) -> bool:
    """An eBPF device program in runc's format: the first rule matching the device with every requested
    access bit decides; no match denies."""
    wanted = _bits(access)
    for rule in rules:
        if rule.covers(type, major, minor) and wanted <= _bits(rule.access):
            return rule.allow
    return False


def grants(allows: Callable[[str, int, int, str], bool], rule: Rule) -> bool:
    """Does a policy (``Policy.allows`` or a ``first_match`` closure) already grant an allow ``rule`` of one
    device, for every subset of its access (the kernel asks per operation: r, w, m, or rw at open)?"""
    assert rule.allow and rule.major is not None and rule.minor is not None and rule.type in ("b", "c")
    letters = rule.access
    subsets = [""]
    for letter in letters:
        subsets += [s + letter for s in subsets]
    return all(allows(rule.type, rule.major, rule.minor, s) for s in subsets if s)
