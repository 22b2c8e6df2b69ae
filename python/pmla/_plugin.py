# SPDX-License-Identifier: MIT
"""Finding and opening libpmla-registry, and the registry's backends."""
import collections
import ctypes
import ctypes.util
import os
import sys
import threading
import weakref

from . import _abi
from ._errors import InvalidArgument, LoadError

try:  # written by `make install` (python/local.mk): where pmla was installed
    from . import _paths
except ImportError:  # used from the source tree
    _paths = None

_REGISTRY_SONAME = "libpmla-registry.so.0" if sys.platform != "darwin" else \
    "libpmla-registry.0.dylib"

BackendInfo = collections.namedtuple(
    "BackendInfo", "name description abi_version agreed_version path")
BackendInfo.__doc__ = """A backend of the registry: name, description, abi_version (the
highest ABI version it implements, e.g. "1.1"), agreed_version (the version the
registry negotiated with its plugin) and path (the plugin file)."""


def _source_tree_build():
    """The build tree this package sits in when used from the source tree
    (python/pmla -> the top of the tree, where an in-tree build puts abi/.libs)."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         os.pardir, os.pardir))


def _candidates():
    """(registry library, plugin fallback path or None), in search order."""
    env = os.environ.get("PMLA_REGISTRY_LIB")
    if env:
        return [(env, None)]
    out = []
    builds = []
    if os.environ.get("PMLA_BUILD_DIR"):
        builds.append(os.environ["PMLA_BUILD_DIR"])
    builds.append(_source_tree_build())
    for b in builds:
        lib = os.path.join(b, "abi", ".libs", _REGISTRY_SONAME)
        out.append((lib, os.path.join(b, "plugin", ".libs")))
    if _paths is not None:  # installed: the registry finds its own plugin directory
        out.append((os.path.join(_paths.LIBDIR, _REGISTRY_SONAME), None))
    found = ctypes.util.find_library("pmla-registry")
    if found:
        out.append((found, None))
    out.append((_REGISTRY_SONAME, None))
    return out


def _open_library():
    tried = []
    explicit = bool(os.environ.get("PMLA_REGISTRY_LIB"))
    for lib, plugins in _candidates():
        if os.sep in lib and not os.path.exists(lib):
            tried.append("%s (no such file)" % lib)
            continue
        try:
            handle = ctypes.CDLL(lib)
        except OSError as e:
            tried.append("%s (%s)" % (lib, e))
            continue
        return handle, lib, plugins
    hint = "" if explicit else ("; set PMLA_REGISTRY_LIB to the library's path, or "
                                "PMLA_BUILD_DIR to a pmla build tree")
    raise LoadError("cannot open libpmla-registry: tried %s%s" % ("; ".join(tried), hint))


def _text(raw):
    """A name or description a plugin gave (bytes, may be NULL) as str; bytes
    that are not UTF-8 are replaced, so one plugin's odd text does not break
    the listing of every backend."""
    return raw.decode("utf-8", "replace") if raw else ""


class _Registry:
    """An open pmla_registry and the native builders made from its backends.
    Closing it destroys those builders first, then closes the registry
    (which dlcloses the plugins), so no builder outlives its plugin's code,
    whatever order a garbage collection finalises the Python objects in."""

    def __init__(self, lib, reg):
        self.lib = lib
        self.reg = reg
        self._live = {}  # native builder handle -> its backend's destroy_builder
        # re-entrant: the cycle collector may finalise a builder (whose
        # close() comes back here) inside a locked region on the same thread
        self._lock = threading.RLock()

    def adopt(self, handle, destroy):
        with self._lock:
            self._live[handle] = destroy

    def release(self, handle):
        """Destroys a native builder this registry still holds (once). Under
        the lock, so that no close() unloads the plugin meanwhile."""
        with self._lock:
            destroy = self._live.pop(handle, None)
            if destroy is not None:
                destroy(handle)

    def close(self):
        with self._lock:
            reg, self.reg = self.reg, None
            live, self._live = self._live, {}
            if reg is None:
                return
            for handle, destroy in live.items():
                destroy(handle)
            self.lib.pmla_registry_close(reg)

    def __del__(self):
        if sys is None or sys.is_finalizing():
            return  # leave the plugins mapped while the interpreter goes down
        self.close()


class _Backend:
    """One backend's vtable, with its function pointers bound once. It holds
    the registry (not the Plugin), which stays open while it lives."""

    def __init__(self, registry, ptr):
        be = ptr.contents
        self.registry = registry
        self.ptr = ptr
        self.name = _text(be.name)
        self.description = _text(be.description)
        self.abi_version = be.abi_version
        for slot in ("init_builder", "destroy_builder", "query_builder", "build_decode",
                     "build_sparse", "decode", "last_error", "check_device_error",
                     "copy_buffer"):
            setattr(self, slot, getattr(be, slot))

    def error_message(self, handle):
        msg = self.last_error(handle)
        return msg.decode("utf-8", "replace") if msg else ""


class Plugin:
    """An open registry: the backends found on a plugin search path.

    Builders keep the registry open; close() closes this plugin's builders
    and the registry, which dlcloses the plugins; without close() that
    happens when the Plugin and its last builder are gone."""

    def __init__(self, path=None):
        if path is not None and (not isinstance(path, (str, bytes, os.PathLike)) or
                                 b"\0" in os.fsencode(path)):
            raise InvalidArgument("load: path = %r; accepted: a str, bytes or os.PathLike "
                                  "without NUL (a ':'-separated list of plugin files or "
                                  "directories), or None" % (path,))
        lib, lib_path, fallback = _open_library()
        _abi.declare_registry(lib)
        self._lib = lib
        self.registry_path = lib_path
        # The registry scans $PMLA_PLUGIN_PATH, then path; when neither names
        # anything, the directory plugins were installed to. A registry
        # library from a build tree gets that tree's plugins instead.
        if path is None and not os.environ.get("PMLA_PLUGIN_PATH") and fallback:
            path = fallback
        reg = ctypes.c_void_p()
        st = lib.pmla_registry_open(os.fsencode(path) if path is not None else None,
                                    ctypes.byref(reg))
        if st != _abi.OK:
            raise LoadError("pmla_registry_open failed: %s" % self.status_name(st))
        self._registry = _Registry(lib, reg.value)
        if hasattr(lib, "pmla_registry_search_path"):
            lib.pmla_registry_search_path.argtypes = [ctypes.c_void_p]
            lib.pmla_registry_search_path.restype = ctypes.c_char_p
            found = lib.pmla_registry_search_path(self._reg)
            #: the path the registry scanned, entries joined with ':'
            self.search_path = os.fsdecode(found) if found else ""
        else:  # an older registry: the argument, then $PMLA_PLUGIN_PATH
            self.search_path = ":".join(p for p in (path, os.environ.get("PMLA_PLUGIN_PATH"))
                                        if p)
        self.plugindir = None
        if hasattr(lib, "pmla_registry_plugindir"):
            lib.pmla_registry_plugindir.argtypes = []
            lib.pmla_registry_plugindir.restype = ctypes.c_char_p
            #: the installed plugin directory searched when no path is named
            self.plugindir = os.fsdecode(lib.pmla_registry_plugindir() or b"") or None
        self._backends = {}
        self._builders = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closing = False  # set, under _lock, by the first close()

    @property
    def _reg(self):
        """The registry handle; None once closed."""
        return self._registry.reg

    def _check_open(self):
        if self._reg is None:
            raise LoadError("the registry is closed")

    @property
    def backends(self):
        """[BackendInfo], in registry order."""
        self._check_open()
        lib, reg, out = self._lib, self._reg, []
        for i in range(lib.pmla_registry_count(reg)):
            be = lib.pmla_registry_backend(reg, i).contents
            path = lib.pmla_registry_backend_path(reg, i)
            out.append(BackendInfo(_text(be.name), _text(be.description),
                                   _abi.version_str(be.abi_version),
                                   _abi.version_str(lib.pmla_registry_backend_version(reg, i)),
                                   os.fsdecode(path) if path else None))
        return out

    @property
    def backend_names(self):
        return [b.name for b in self.backends]

    @property
    def diagnostics(self):
        """The registry's notes on skipped files and shadowed names ("" when none)."""
        self._check_open()
        d = self._lib.pmla_registry_diagnostics(self._reg)
        return d.decode("utf-8", "replace") if d else ""

    def status_name(self, status):
        n = self._lib.pmla_status_name(status)
        return n.decode() if n else str(status)

    def backend(self, name):
        """The vtable of backend `name` (internal; Builder uses it)."""
        try:
            raw = name.encode() if isinstance(name, str) and "\0" not in name else None
        except UnicodeEncodeError:
            raw = None
        if raw is None:
            raise InvalidArgument("backend = %r; accepted: a backend name (str, UTF-8, no NUL), "
                                  "e.g. 'pmla' or 'pmla-cpu'" % (name,))
        with self._lock:
            self._check_open()
            be = self._backends.get(name)
            if be is None:
                ptr = self._lib.pmla_registry_find(self._reg, raw)
                if not ptr:
                    diag = self.diagnostics
                    raise InvalidArgument(
                        "backend %r is not on the plugin path (%s); found: %s%s"
                        % (name, self.search_path or "nothing searched",
                           ", ".join(self.backend_names) or "none",
                           ("\n" + diag.rstrip()) if diag else ""))
                be = self._backends[name] = _Backend(self._registry, ptr)
            return be

    def close(self):
        """Closes this plugin's open builders, then the registry."""
        if getattr(self, "_reg", None) is not None:
            with self._lock:  # Builder() adds to the set from any thread
                self._closing = True  # a Builder() from now on is refused
                builders = list(self._builders)
            for b in builders:
                b.close()
            self._registry.close()
            self._backends = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<pmla.Plugin %s backends=%s>" % (
            self.search_path, self.backend_names if self._reg is not None else "closed")


_default = None
_default_lock = threading.Lock()


def load(path=None):
    """Opens libpmla-registry and the plugins it finds. The registry scans
    $PMLA_PLUGIN_PATH first, then path (a colon-separated list of plugin
    files or directories); when neither names anything, the directory the
    plugins were installed to, or, for a registry library taken from a build
    tree, that tree's plugin/.libs. Returns a Plugin."""
    return Plugin(path)


def default_plugin():
    """The Plugin that builders use when given none: load() once per process."""
    global _default
    with _default_lock:
        if _default is None or _default._reg is None:
            _default = load()
        return _default
