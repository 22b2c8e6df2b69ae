/* SPDX-License-Identifier: MIT */
/* registry.c - host-side plugin discovery: scan the search path
 * ($PMLA_PLUGIN_PATH, then the argument, else the configured plugindir),
 * dlopen, negotiate, index backends by name (first on the path wins). */
#define _GNU_SOURCE /* dladdr1, dlinfo: whose file a symbol is */
#include "pmla_registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where `make install` puts plugins (configure's plugindir); abi/local.mk
 * defines it. Searched only when no path is named. */
#ifndef PMLA_PLUGINDIR
#define PMLA_PLUGINDIR ""
#endif

typedef struct entry {
  const pmla_backend *backend;
  char *path;
  uint32_t version;
  uint32_t slot; /* its index in the plugin's backends array */
} entry;

/* a file or directory the scan has read, by identity (a name may reach
 * it twice: a repeated path entry, a link) */
typedef struct seen_file {
  dev_t dev;
  ino_t ino;
} seen_file;

/* Diagnostics stop growing here; what follows is counted, not kept (a
 * path that names one plugin of many backends many times would otherwise
 * fill memory with lines). */
#define DIAG_CAP (64u * 1024u)

struct pmla_registry {
  void **handles;
  size_t num_handles, cap_handles;
  entry *entries;
  size_t num_entries, cap_entries;
  seen_file *seen;
  size_t num_seen, cap_seen;
  char *diag;
  size_t diag_len, diag_cap, diag_dropped;
  char *searched; /* the path scanned, entries joined with ':' */
  size_t searched_len, searched_cap;
};

const char *pmla_status_name(pmla_status s) {
  static const char *const names[] = {
      "PMLA_OK", "PMLA_ERR_INVALID_ARGUMENT", "PMLA_ERR_UNSUPPORTED", "PMLA_ERR_VERSION",
      "PMLA_ERR_STRUCT_SIZE", "PMLA_ERR_CAPACITY", "PMLA_ERR_NO_DEVICE",
      "PMLA_ERR_OUT_OF_MEMORY", "PMLA_ERR_DEVICE", "PMLA_ERR_BAD_STATE",
      "PMLA_ERR_DEVICE_INPUT", "PMLA_ERR_INTERNAL"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "PMLA_ERR_UNKNOWN";
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 1;
  size_t n = *cap ? *cap * 2 : 8;
  while (n < need)
    n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q)
    return 0;
  *p = q;
  *cap = n;
  return 1;
}

static void diag(pmla_registry *r, const char *fmt, ...) {
  char small[768], *line = small;
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n >= sizeof small) { /* a long path: the line whole */
    line = malloc((size_t)n + 1);
    if (line)
      vsnprintf(line, (size_t)n + 1, fmt, again);
  }
  va_end(again);
  if (n < 0 || !line)
    return;
  if (r->diag_dropped || r->diag_len + (size_t)n + 1 > DIAG_CAP) { /* the rest in order */
    r->diag_dropped++;
  } else if (grow((void **)&r->diag, &r->diag_cap, r->diag_len + (size_t)n + 2, 1)) {
    for (int i = 0; i < n; i++) /* a name's newline must not start a line of its own */
      if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
        line[i] = '?';
    memcpy(r->diag + r->diag_len, line, (size_t)n);
    r->diag_len += (size_t)n;
    r->diag[r->diag_len++] = '\n';
    r->diag[r->diag_len] = '\0';
  }
  if (line != small)
    free(line);
}

/* Copies the plugin's message reading no further than its fixed array; one
 * that fills the array without a NUL is copied whole and marked as such. */
static void copy_message(char *dst, size_t size, const char *src, size_t src_size) {
  size_t len = strnlen(src, src_size);
  if (len < src_size)
    snprintf(dst, size, "%.*s", (int)len, src);
  else
    snprintf(dst, size, "plugin message fills all %zu bytes without a NUL terminator: %.*s",
             src_size, (int)len, src);
}

pmla_status pmla_negotiate(pmla_entry_fn fn, uint32_t lo, uint32_t hi, const pmla_plugin **plugin,
                           uint32_t *agreed, char *message, size_t message_size) {
  if (!fn || !plugin || !agreed) {
    if (message && message_size)
      snprintf(message, message_size, "pmla_negotiate: %s is NULL",
               !fn ? "entry" : !plugin ? "plugin" : "agreed");
    return PMLA_ERR_INVALID_ARGUMENT;
  }
  pmla_negotiation n;
  memset(&n, 0, sizeof n);
  n.struct_size = sizeof n;
  n.host_min_version = lo;
  n.host_max_version = hi;
  pmla_status st = fn(&n);
  if (message && message_size)
    copy_message(message, message_size, n.message, sizeof n.message);
  if (st != PMLA_OK)
    return st;
  if (!n.plugin) {
    if (message && message_size)
      snprintf(message, message_size, "plugin answered PMLA_OK but returned no plugin descriptor");
    return PMLA_ERR_INTERNAL;
  }
  if (n.agreed_version < lo || n.agreed_version > hi) {
    if (message && message_size)
      snprintf(message, message_size, "plugin answered version %u.%u outside %u.%u..%u.%u",
               PMLA_VERSION_MAJOR(n.agreed_version), PMLA_VERSION_MINOR(n.agreed_version),
               PMLA_VERSION_MAJOR(lo), PMLA_VERSION_MINOR(lo), PMLA_VERSION_MAJOR(hi),
               PMLA_VERSION_MINOR(hi));
    return PMLA_ERR_VERSION;
  }
  *plugin = n.plugin;
  *agreed = n.agreed_version;
  return PMLA_OK;
}

static const pmla_backend *find(const pmla_registry *r, const char *name, size_t *index) {
  for (size_t i = 0; i < r->num_entries; i++)
    if (strcmp(r->entries[i].backend->name, name) == 0) {
      if (index)
        *index = i;
      return r->entries[i].backend;
    }
  return NULL;
}

/* Whether dlopen may be given `path`: a regular file (dlopen of a FIFO
 * would wait for a writer forever) that is a shared library whose loadable
 * segments all lie inside the file (glibc maps a cut-off one and the host
 * dies of SIGBUS when it touches the missing pages: a copy still being
 * written, a full disk). Returns 1, or 0 with the reason in `why`; *id is
 * the file's identity. ELF objects of another class are left to dlopen,
 * which refuses them with its own message. */
static int loadable(const char *path, seen_file *id, char *why, size_t why_size) {
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, why_size, "%s", strerror(errno));
    return 0;
  }
  struct stat sb;
  ElfW(Ehdr) eh;
  memset(&eh, 0, sizeof eh);
  int ok = 0;
  ssize_t got = 0;
  if (fstat(fd, &sb) != 0) {
    snprintf(why, why_size, "%s", strerror(errno));
  } else if (!S_ISREG(sb.st_mode)) {
    snprintf(why, why_size, "not a regular file");
  } else if ((got = pread(fd, &eh, sizeof eh, 0)) < SELFMAG ||
             memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    snprintf(why, why_size, "not a pmla plugin (not a shared library)");
  } else if (got < (ssize_t)sizeof eh) {
    snprintf(why, why_size, "a shared library cut short: %lld bytes, not even its ELF header",
             (long long)got);
  } else {
    id->dev = sb.st_dev;
    id->ino = sb.st_ino;
    ok = 1;
    const uint64_t size = (uint64_t)sb.st_size;
    if (eh.e_ident[EI_CLASS] == (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) &&
        eh.e_phentsize == sizeof(ElfW(Phdr))) {
      const uint64_t table = (uint64_t)eh.e_phnum * sizeof(ElfW(Phdr));
      uint64_t need = eh.e_phoff > size || table > size - eh.e_phoff ? eh.e_phoff + table : 0;
      for (unsigned i = 0; !need && i < eh.e_phnum; i++) {
        ElfW(Phdr) ph;
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + i * sizeof ph)) != (ssize_t)sizeof ph)
          need = size + 1;
        else if (ph.p_type == PT_LOAD && (ph.p_filesz > size || ph.p_offset > size - ph.p_filesz))
          need = (uint64_t)ph.p_offset + ph.p_filesz;
      }
      if (need) {
        snprintf(why, why_size,
                 "a shared library cut short: its segments reach byte %llu of a %llu-byte file "
                 "(a copy not finished?)",
                 (unsigned long long)need, (unsigned long long)size);
        ok = 0;
      }
    }
  }
  close(fd);
  return ok;
}

/* 1 when the file or directory `id` was read before; notes it otherwise */
static int seen_before(pmla_registry *r, seen_file id) {
  for (size_t i = 0; i < r->num_seen; i++)
    if (r->seen[i].dev == id.dev && r->seen[i].ino == id.ino)
      return 1;
  if (grow((void **)&r->seen, &r->cap_seen, r->num_seen + 1, sizeof id))
    r->seen[r->num_seen++] = id;
  return 0;
}

/* The name of the first 1.0 function slot of b that is NULL, or NULL. */
static const char *null_slot(const pmla_backend *b) {
  return !b->init_builder         ? "init_builder"
         : !b->destroy_builder    ? "destroy_builder"
         : !b->query_builder      ? "query_builder"
         : !b->build_decode       ? "build_decode"
         : !b->build_sparse       ? "build_sparse"
         : !b->decode             ? "decode"
         : !b->last_error         ? "last_error"
         : !b->check_device_error ? "check_device_error"
         : !b->copy_buffer        ? "copy_buffer"
                                  : NULL;
}

/* 1 when sym is defined in the library of handle h itself: dlsym also
 * finds a symbol in h's dependencies, which would pass a library that
 * merely links a plugin off as that plugin */
static int defined_in(void *h, void *sym) {
  struct link_map *own = NULL, *of_sym = NULL;
  Dl_info info;
  return dlinfo(h, RTLD_DI_LINKMAP, &own) == 0 &&
         dladdr1(sym, &info, (void **)&of_sym, RTLD_DL_LINKMAP) != 0 && own == of_sym;
}

static void load_file(pmla_registry *r, const char *path) {
  char why[256];
  seen_file id;
  if (!loadable(path, &id, why, sizeof why)) {
    diag(r, "skipped %s: %s", path, why);
    return;
  }
  if (seen_before(r, id)) {
    diag(r, "skipped %s: the same file was read before on this path", path);
    return;
  }
  /* a name without a slash is searched for by dlopen (LD_LIBRARY_PATH, the
   * system's directories): the file checked here is the one in the
   * current directory */
  char *here = NULL;
  if (!strchr(path, '/') && (here = malloc(strlen(path) + 3)) != NULL)
    sprintf(here, "./%s", path);
  void *h = dlopen(here ? here : path, RTLD_NOW | RTLD_LOCAL);
  free(here);
  if (!h) {
    const char *dl = dlerror();
    diag(r, "skipped %s: a shared library that cannot be loaded: %s", path,
         dl ? dl : "dlopen failed");
    return;
  }
  void *sym = dlsym(h, PMLA_ENTRY_SYMBOL);
  if (!sym) {
    diag(r, "skipped %s: not a pmla plugin (no %s symbol)", path, PMLA_ENTRY_SYMBOL);
    dlclose(h);
    return;
  }
  if (!defined_in(h, sym)) {
    diag(r, "skipped %s: not a pmla plugin (%s is not its own: a library it links defines it)",
         path, PMLA_ENTRY_SYMBOL);
    dlclose(h);
    return;
  }
  pmla_entry_fn fn;
  memcpy(&fn, &sym, sizeof fn);
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0;
  char msg[sizeof(((pmla_negotiation *)0)->message) + 96];
  pmla_status st = pmla_negotiate(fn, PMLA_VERSION(PMLA_ABI_MAJOR, 0), PMLA_ABI_VERSION, &plugin,
                                  &agreed, msg, sizeof msg);
  if (st != PMLA_OK) {
    diag(r, "skipped %s: negotiation failed (%s): %s", path, pmla_status_name(st), msg);
    dlclose(h);
    return;
  }
  /* the descriptor as a whole: its size, then its count, then its array */
  if (plugin->struct_size < sizeof(pmla_plugin)) {
    diag(r, "skipped %s: plugin descriptor truncated (struct_size %u < %zu)", path,
         plugin->struct_size, sizeof(pmla_plugin));
    dlclose(h);
    return;
  }
  if (plugin->backend_count > PMLA_REGISTRY_MAX_BACKENDS) {
    diag(r, "skipped %s: plugin descriptor lists %u backends, more than the %u accepted", path,
         plugin->backend_count, PMLA_REGISTRY_MAX_BACKENDS);
    dlclose(h);
    return;
  }
  if (!plugin->backend_count) {
    diag(r, "skipped %s: its plugin descriptor lists no backends", path);
    dlclose(h);
    return;
  }
  if (!plugin->backends) {
    diag(r, "skipped %s: plugin descriptor lists %u backends but the backends array is NULL",
         path, plugin->backend_count);
    dlclose(h);
    return;
  }
  size_t added = 0, first = r->num_entries;
  for (uint32_t i = 0; i < plugin->backend_count; i++) {
    /* each backend: the pointer, then its size, then its name */
    const pmla_backend *b = plugin->backends[i];
    if (!b) {
      diag(r, "skipped backend #%u of %s: the backends array holds NULL there", i, path);
      continue;
    }
    if (b->struct_size < sizeof(pmla_backend)) {
      const char *name = PMLA_HAS_MEMBER(b, pmla_backend, name) ? b->name : NULL;
      diag(r, "skipped backend #%u%s%s%s of %s: vtable truncated (struct_size %u < %zu)", i,
           name ? " \"" : "", name ? name : "", name ? "\"" : "", path, b->struct_size,
           sizeof(pmla_backend));
      continue;
    }
    if (!b->name) {
      diag(r, "skipped backend #%u of %s: it has no name (name is NULL)", i, path);
      continue;
    }
    if (!b->name[0]) {
      diag(r, "skipped backend #%u of %s: it has an empty name", i, path);
      continue;
    }
    if (strnlen(b->name, PMLA_REGISTRY_MAX_NAME + 1) > PMLA_REGISTRY_MAX_NAME) {
      diag(r, "skipped backend #%u of %s: its name is longer than %u bytes (or has no NUL): "
              "%.40s...",
           i, path, PMLA_REGISTRY_MAX_NAME, b->name);
      continue;
    }
    if (PMLA_VERSION_MAJOR(b->abi_version) != PMLA_VERSION_MAJOR(agreed)) {
      diag(r, "skipped backend #%u \"%s\" of %s: it implements ABI %u.%u, the plugin agreed %u.%u",
           i, b->name, path, PMLA_VERSION_MAJOR(b->abi_version),
           PMLA_VERSION_MINOR(b->abi_version), PMLA_VERSION_MAJOR(agreed),
           PMLA_VERSION_MINOR(agreed));
      continue;
    }
    if (r->num_entries >= PMLA_REGISTRY_MAX_BACKENDS) {
      diag(r, "skipped backends #%u.. of %s: the registry holds its most, %u backends", i, path,
           PMLA_REGISTRY_MAX_BACKENDS);
      break;
    }
    const char *missing = null_slot(b);
    if (missing) {
      diag(r, "skipped backend #%u \"%s\" of %s: its %s function is NULL", i, b->name, path,
           missing);
      continue;
    }
    size_t prior;
    if (find(r, b->name, &prior)) {
      if (prior >= first)
        diag(r, "ignored backend #%u \"%s\" of %s: the same plugin lists it first as backend #%u",
             i, b->name, path, r->entries[prior].slot);
      else
        diag(r, "ignored backend #%u \"%s\" of %s: already provided by %s", i, b->name, path,
             r->entries[prior].path);
      continue;
    }
    char *p = strdup(path);
    if (!p || !grow((void **)&r->entries, &r->cap_entries, r->num_entries + 1, sizeof(entry))) {
      free(p);
      diag(r, "skipped backend #%u \"%s\" of %s: out of memory", i, b->name, path);
      continue;
    }
    /* a backend older than the plugin's agreed minor is used at its own */
    const uint32_t version = b->abi_version < agreed ? b->abi_version : agreed;
    r->entries[r->num_entries++] = (entry){b, p, version, i};
    added++;
  }
  if (!added || !grow((void **)&r->handles, &r->cap_handles, r->num_handles + 1, sizeof(void *))) {
    if (added) { /* cannot track the handle: drop its entries again */
      while (added--)
        free(r->entries[--r->num_entries].path);
    }
    dlclose(h);
    return;
  }
  r->handles[r->num_handles++] = h;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_dir(pmla_registry *r, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    diag(r, "skipped %s: cannot open directory: %s", dir, strerror(errno));
    return;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0)
      continue;
    char *full = malloc(strlen(dir) + len + 2);
    if (!full || !grow((void **)&names, &cap, n + 1, sizeof *names)) {
      free(full);
      break;
    }
    sprintf(full, "%s/%s", dir, e->d_name);
    names[n++] = full;
  }
  closedir(d);
  if (n > 1) /* names is NULL when the directory held no .so */
    qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    load_file(r, names[i]);
    free(names[i]);
  }
  free(names);
}

/* Appends one entry to the path the registry reports as searched. */
static void note_searched(pmla_registry *r, const char *item, size_t len) {
  if (!grow((void **)&r->searched, &r->searched_cap, r->searched_len + len + 2, 1))
    return;
  if (r->searched_len)
    r->searched[r->searched_len++] = ':';
  memcpy(r->searched + r->searched_len, item, len);
  r->searched_len += len;
  r->searched[r->searched_len] = '\0';
}

/* Scans each entry of a colon-separated path; `from` says where the path
 * came from. Returns 1 when the path named at least one entry. */
static int scan(pmla_registry *r, const char *path, const char *from) {
  int named = 0;
  for (const char *p = path; p && *p;) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len) {
      named = 1;
      char *item = strndup(p, len);
      if (!item)
        return named;
      note_searched(r, item, len);
      struct stat st;
      if (stat(item, &st) != 0)
        diag(r, "skipped %s (%s): %s", item, from,
             errno == ENOENT ? "no such file or directory" : strerror(errno));
      else if (S_ISDIR(st.st_mode)) {
        if (seen_before(r, (seen_file){st.st_dev, st.st_ino})) {
          diag(r, "skipped directory %s (%s): searched before on this path", item, from);
        } else {
          diag(r, "searched directory %s (%s)", item, from);
          load_dir(r, item);
        }
      } else {
        diag(r, "searched file %s (%s)", item, from);
        load_file(r, item);
      }
      free(item);
    }
    if (!end)
      break;
    p = end + 1;
  }
  return named;
}

pmla_status pmla_registry_open(const char *search_path, pmla_registry **out) {
  if (!out)
    return PMLA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  pmla_registry *r = calloc(1, sizeof *r);
  if (!r)
    return PMLA_ERR_OUT_OF_MEMORY;
  /* the environment overrides the program's path, as LD_LIBRARY_PATH does */
  int named = scan(r, getenv(PMLA_PLUGIN_PATH_ENV), "from " PMLA_PLUGIN_PATH_ENV);
  named |= scan(r, search_path, "from the program's argument");
  if (!named) {
    if (*PMLA_PLUGINDIR)
      scan(r, PMLA_PLUGINDIR, "the installed plugin directory: neither " PMLA_PLUGIN_PATH_ENV
                              " nor the program named a path");
    else
      diag(r, "searched nothing: neither %s nor the program named a path, and this registry "
              "was built without a plugin directory", PMLA_PLUGIN_PATH_ENV);
  }
  if (r->diag_dropped) { /* past the cap: one line says how many went */
    char tail[96];
    int n = snprintf(tail, sizeof tail,
                     "... %zu more lines not kept (diagnostics stop at %u bytes)\n",
                     r->diag_dropped, DIAG_CAP);
    if (n > 0 && grow((void **)&r->diag, &r->diag_cap, r->diag_len + (size_t)n + 1, 1)) {
      memcpy(r->diag + r->diag_len, tail, (size_t)n + 1);
      r->diag_len += (size_t)n;
    }
  }
  *out = r;
  return PMLA_OK;
}

void pmla_registry_close(pmla_registry *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->num_entries; i++)
    free(r->entries[i].path);
  for (size_t i = r->num_handles; i-- > 0;)
    dlclose(r->handles[i]);
  free(r->entries);
  free(r->seen);
  free(r->handles);
  free(r->diag);
  free(r->searched);
  free(r);
}

size_t pmla_registry_count(const pmla_registry *r) { return r ? r->num_entries : 0; }

const pmla_backend *pmla_registry_backend(const pmla_registry *r, size_t i) {
  return r && i < r->num_entries ? r->entries[i].backend : NULL;
}

const char *pmla_registry_backend_path(const pmla_registry *r, size_t i) {
  return r && i < r->num_entries ? r->entries[i].path : NULL;
}

uint32_t pmla_registry_backend_version(const pmla_registry *r, size_t i) {
  return r && i < r->num_entries ? r->entries[i].version : 0;
}

const pmla_backend *pmla_registry_find(const pmla_registry *r, const char *name) {
  return r && name ? find(r, name, NULL) : NULL;
}

const char *pmla_registry_diagnostics(const pmla_registry *r) {
  return r && r->diag ? r->diag : "";
}

const char *pmla_registry_search_path(const pmla_registry *r) {
  return r && r->searched ? r->searched : "";
}

const char *pmla_registry_plugindir(void) { return PMLA_PLUGINDIR; }
