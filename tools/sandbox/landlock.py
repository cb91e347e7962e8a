"""Landlock: how the ``rlimits`` level hides the host's files without any namespace.

Landlock (Linux >= 5.13, ``CONFIG_SECURITY_LANDLOCK`` and ``landlock`` in the active LSMs) lets
an unprivileged process give up access to every file outside a set of directories, for good
and for everything it starts. The sandbox child calls :func:`restrict` before any user code,
with rules planned here by :func:`plan` from the same host view the namespace levels mount
(see :mod:`.isolation`): read, list and execute only the system directories, the Python
installation, the allowed packages and the call's working directories. Everything else (the
checkout, home directories, other packages' files) fails with ``PermissionError``.

What Landlock cannot do as mounts can: a rule grants a whole tree, nothing inside it can be
taken back. So a directory that contains something hidden (the standard library holds the
base ``site-packages``) gets only the right to be *listed*, and its other entries get rules of
their own: names inside hidden directories can be listed, their contents cannot be read.
Writes are left to the uid's permissions (this module hides, it does not fence writes).

This file is also executed inside the sandbox (its code travels with the launch): module
level holds only constants and functions, and :func:`restrict` imports nothing but
``_ctypes`` and ``posix``.

Example::

    from agentrl.tools.sandbox import landlock
    if landlock.abi_version() >= 1:
        handled, rules = landlock.plan(["/usr"], [], [], [])
"""

# Syscall numbers of the Landlock calls: the same on every architecture (added after the
# tables were unified).
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
EXECUTE, READ_FILE, READ_DIR = 1 << 0, 1 << 2, 1 << 3
REFER = 1 << 13  # ABI 2: moving files between directories, denied everywhere unless granted
READ = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | READ_FILE  # what a rule on a file (not a directory) may grant


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    syscall, _, _, Long = _libc_calls()
    return max(syscall(Long(CREATE_RULESET), None, Long(0), Long(CREATE_RULESET_VERSION)), 0)


def plan(shown, masks, listable, private, abi=1):
    """``(handled, rules)`` for :func:`restrict`. ``shown``: trees the code may read whole,
    except what lies in ``masks``; ``listable``: directories whose names may be listed
    (site-packages on the code's path: the import system lists them); ``private``:
    ``(path, access)`` granted as given (``/dev``, ``/proc``, the working directories)."""
    import os

    handled = READ | (REFER if abi >= 2 else 0)
    rules = []

    def add(path, access):
        if not os.path.isdir(path):
            access &= FILE_RIGHTS
        if access & handled:
            rules.append((path, access & handled))

    def cover(path):
        inner = [m for m in masks if m.startswith(path + "/")]
        if not inner:
            add(path, READ)
            return
        add(path, READ_DIR)  # listing reaches into the hidden part; reading does not
        for name in sorted(os.listdir(path)):
            entry = os.path.join(path, name)
            if entry in masks or os.path.islink(entry):  # a link's target has rules of its own
                continue
            cover(entry) if os.path.isdir(entry) else add(entry, READ)

    for path in shown:
        if os.path.exists(path):
            cover(path)
    for path in listable:
        add(path, READ_DIR)
    for path, access in private:
        if os.path.exists(path):
            add(path, access)
    return handled, rules


def plan_view(view, abi):
    """:func:`plan` for a ``config.HostView``: the view, ``/dev``, ``/proc`` and ``/sys``
    (read and list; executing from them is not needed)."""
    private = [(p, READ_FILE | READ_DIR) for p in ("/dev", "/proc", "/sys")]
    return plan(view.shown, view.masks, view.sys_path, private, abi)


def restrict(rules, handled):
    """Apply ``rules`` to this process and all it starts (no way back). Sets no_new_privs,
    which Landlock requires of an unprivileged caller. Raises OSError naming the failing step."""
    import posix

    syscall, prctl, get_errno, Long = _libc_calls()

    def check(ret, what):
        if ret < 0:
            raise OSError(get_errno(), "landlock %s: %s (run at the bwrap level to hide files by mounts instead)"
                          % (what, posix.strerror(get_errno())))

    # The kernel's structs as bytes (little-endian on every architecture Landlock runs on here):
    # landlock_ruleset_attr {u64 handled_access_fs}; landlock_path_beneath_attr, packed {u64; s32}.
    attr = handled.to_bytes(8, "little")
    ruleset = syscall(Long(CREATE_RULESET), attr, Long(len(attr)), Long(0))
    check(ruleset, "create_ruleset")
    try:
        add, target, kind, zero = Long(ADD_RULE), Long(ruleset), Long(RULE_PATH_BENEATH), Long(0)
        flags = posix.O_PATH | posix.O_CLOEXEC
        for path, access in rules:
            try:
                fd = posix.open(path, flags)
            except OSError:
                continue  # gone since the plan was made: nothing to grant
            try:
                rule = access.to_bytes(8, "little") + fd.to_bytes(4, "little", signed=True)
                check(syscall(add, target, kind, rule, zero), "add_rule " + path)
            finally:
                posix.close(fd)
        check(prctl(Long(PR_SET_NO_NEW_PRIVS), Long(1), Long(0), Long(0), Long(0)), "no_new_privs")
        check(syscall(Long(RESTRICT_SELF), Long(ruleset), Long(0)), "restrict_self")
    finally:
        posix.close(ruleset)


def _libc_calls():
    """libc's ``syscall`` and ``prctl`` through ``_ctypes`` itself: importing ``ctypes`` costs
    ~2.5 ms of every sandbox start (it imports ``os``), ``_ctypes`` ~0.4 ms. These are the
    classes ``ctypes.CDLL`` builds, made by hand."""
    import _ctypes

    class Long(_ctypes._SimpleCData):
        _type_ = "l"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Long

    class Libc:
        _handle = _ctypes.dlopen(None, 0)

    return Function(("syscall", Libc)), Function(("prctl", Libc)), _ctypes.get_errno, Long
