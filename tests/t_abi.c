/* SPDX-License-Identifier: MIT */
/* t_abi.c - the plugin boundary: exported symbols, version negotiation,
 * struct_size handling, the plugin descriptor, and the registry (lookup,
 * search path order, bad files, mock plugins). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define V(a, b) PMLA_VERSION(a, b)

/* ---- helpers ---- */

static void *open_plugin(pmla_entry_fn *entry) {
  void *h = dlopen(g_plugin_path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "dlopen(%s): %s", g_plugin_path, dlerror());
  *entry = (pmla_entry_fn)(uintptr_t)dlsym(h, PMLA_ENTRY_SYMBOL);
  ck_assert_msg(*entry != NULL, "%s has no %s", g_plugin_path, PMLA_ENTRY_SYMBOL);
  return h;
}

/* dlopens a mock plugin file and returns its entry point. */
static void *open_file(const char *path, pmla_entry_fn *entry) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "dlopen(%s): %s", path, dlerror());
  *entry = (pmla_entry_fn)(uintptr_t)dlsym(h, PMLA_ENTRY_SYMBOL);
  ck_assert_msg(*entry != NULL, "%s has no %s", path, PMLA_ENTRY_SYMBOL);
  return h;
}

static pmla_status negotiate_raw(pmla_entry_fn entry, uint32_t lo, uint32_t hi,
                                 pmla_negotiation *n) {
  memset(n, 0, sizeof *n);
  n->struct_size = sizeof *n;
  n->host_min_version = lo;
  n->host_max_version = hi;
  return entry(n);
}

/* The highest version the plugin speaks (what it answers for 1.0..1.65535). */
static uint32_t plugin_version(pmla_entry_fn entry) {
  pmla_negotiation n;
  pmla_status s = negotiate_raw(entry, V(1, 0), V(1, 0xffff), &n);
  ck_assert_msg(s == PMLA_OK, "plugin refuses 1.0..1.65535: %s (%s)", harness_status_name(s),
                n.message);
  ck_assert_ptr_nonnull(n.plugin);
  return n.plugin->abi_version;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* The first line of the registry's diagnostics that holds `needle` and is
 * not a "searched ..." line (those name every place the registry looked),
 * copied into buf; "" when no line does. */
static const char *diag_line(const char *diag, const char *needle, char *buf, size_t size) {
  buf[0] = '\0';
  const char *hit = diag, *begin;
  for (;; hit++) {
    if (!(hit = strstr(hit, needle)))
      return buf;
    for (begin = hit; begin > diag && begin[-1] != '\n';)
      begin--;
    if (strncmp(begin, "searched ", 9) != 0)
      break;
  }
  const char *end = strchr(hit, '\n');
  size_t len = end ? (size_t)(end - begin) : strlen(begin);
  if (len >= size)
    len = size - 1;
  memcpy(buf, begin, len);
  buf[len] = '\0';
  return buf;
}

static size_t count_char(const char *s, char c) {
  size_t n = 0;
  for (; *s; s++)
    n += *s == c;
  return n;
}

#define NEGOTIATION_MESSAGE_BYTES sizeof(((pmla_negotiation *)0)->message)

/* Skips the calling test when a mock plugin was not built. */
#define NEED_MOCK(buf, name)                                                               \
  do {                                                                                     \
    if (harness_mock_path(name, buf, sizeof buf)) {                                        \
      printf("SKIP %s: mock plugin %s.so not found in %s (make check builds them in "     \
             "tests/.libs; name that in PMLA_CONFORMANCE_MOCK_DIR)\n",                      \
             __func__, name, g_mock_dir ? g_mock_dir : "(no mock dir)");                   \
      fflush(stdout);                                                                      \
      return;                                                                              \
    }                                                                                      \
  } while (0)

typedef struct tmpdir {
  char path[512];
  char files[16][600];
  int nfiles;
} tmpdir;

static void tmpdir_make(tmpdir *t) {
  const char *base = getenv("TMPDIR");
  snprintf(t->path, sizeof t->path, "%s/pmla-conformance-XXXXXX", base && *base ? base : "/tmp");
  ck_assert_msg(mkdtemp(t->path) != NULL, "mkdtemp(%s) failed", t->path);
  t->nfiles = 0;
}

static const char *tmpdir_file(tmpdir *t, const char *name) {
  ck_assert_int_lt(t->nfiles, 16);
  char *f = t->files[t->nfiles++], tmp[600];
  snprintf(tmp, sizeof tmp, "%s/%s", t->path, name);
  memcpy(f, tmp, sizeof tmp);
  return f;
}

static void tmpdir_write(tmpdir *t, const char *name, const char *text) {
  const char *f = tmpdir_file(t, name);
  FILE *fp = fopen(f, "w");
  ck_assert_msg(fp != NULL, "cannot write %s", f);
  fputs(text, fp);
  fclose(fp);
}

static void tmpdir_link(tmpdir *t, const char *name, const char *target) {
  const char *f = tmpdir_file(t, name);
  ck_assert_msg(symlink(target, f) == 0, "symlink %s -> %s failed", f, target);
}

static void tmpdir_remove(tmpdir *t) {
  for (int i = 0; i < t->nfiles; i++)
    unlink(t->files[i]);
  rmdir(t->path);
}

/* The description of backend name, which must have been found. */
static const char *found_description(pmla_registry *r, const char *name) {
  const pmla_backend *be = pmla_registry_find(r, name);
  ck_assert_msg(be != NULL, "backend %s not found; diagnostics: '%s'", name,
                pmla_registry_diagnostics(r));
  return be->description;
}

static pmla_registry *open_registry(const char *path) {
  pmla_registry *r = NULL;
  pmla_status s = pmla_registry_open(path, &r);
  ck_assert_msg(s == PMLA_OK && r != NULL, "pmla_registry_open(%s) = %s", path,
                harness_status_name(s));
  return r;
}

/* ---- exported symbols ---- */

START_TEST(test_plugin_exports_exactly_the_entry_symbol) {
  if (system("command -v nm >/dev/null 2>&1") != 0) {
    printf("SKIP %s: nm not found; cannot list the plugin's dynamic symbols\n", __func__);
    return;
  }
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s' 2>&1", g_plugin_path);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  char line[1024], others[2048] = "";
  int entry = 0, other = 0;
  while (fgets(line, sizeof line, p)) {
    char addr[128], type[16], name[512];
    if (sscanf(line, "%127s %15s %511s", addr, type, name) != 3)
      continue;
    char *at = strchr(name, '@');
    if (at)
      *at = '\0';
    if (strcmp(type, "A") == 0) /* version nodes of a version script */
      continue;
    if (strcmp(name, PMLA_ENTRY_SYMBOL) == 0) {
      entry++;
    } else {
      other++;
      if (strlen(others) + strlen(name) + 3 < sizeof others) {
        strcat(others, " ");
        strcat(others, name);
      }
    }
  }
  int rc = pclose(p);
  ck_assert_msg(rc == 0, "'%s' failed (status %d)", cmd, rc);
  ck_assert_msg(entry == 1, "%s exported %d times", PMLA_ENTRY_SYMBOL, entry);
  ck_assert_msg(other == 0, "%d other defined dynamic symbols exported:%s", other, others);
}
END_TEST

/* ---- version numbers ---- */

/* PMLA_VERSION is a constant expression, defined for every 16-bit major
 * (an unsigned shift), with the values of a plain (major << 16 | minor). */
_Static_assert(PMLA_VERSION(1, 0) == 0x00010000u, "PMLA_VERSION(1, 0)");
_Static_assert(PMLA_VERSION(0x7fff, 0xffff) == 0x7fffffffu, "PMLA_VERSION(0x7fff, 0xffff)");
_Static_assert(PMLA_VERSION(0x8000, 0) == 0x80000000u, "PMLA_VERSION(0x8000, 0)");
_Static_assert(PMLA_VERSION(0xffff, 0xffff) == 0xffffffffu, "PMLA_VERSION(0xffff, 0xffff)");
_Static_assert(PMLA_VERSION_MAJOR(PMLA_VERSION(0xffff, 3)) == 0xffffu, "major of 0xffff.3");

START_TEST(test_version_macro_is_defined_for_majors_with_the_top_bit_set) {
  /* int operands read at run time, as a host parsing a version would pass */
  static const int majors[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
  static const int minors[] = {0, 1, 0x7fff, 0x8000, 0xffff};
  for (size_t i = 0; i < sizeof majors / sizeof majors[0]; i++)
    for (size_t j = 0; j < sizeof minors / sizeof minors[0]; j++) {
      volatile int major = majors[i], minor = minors[j];
      uint32_t v = PMLA_VERSION(major, minor);
      uint32_t want = (uint32_t)majors[i] * 0x10000u + (uint32_t)minors[j];
      ck_assert_msg(v == want, "PMLA_VERSION(0x%x, 0x%x) = 0x%x, want 0x%x", majors[i],
                    minors[j], v, want);
      ck_assert_uint_eq(PMLA_VERSION_MAJOR(v), (uint32_t)majors[i]);
      ck_assert_uint_eq(PMLA_VERSION_MINOR(v), (uint32_t)minors[j]);
    }
}
END_TEST

/* ---- negotiation against the plugin under test ---- */

START_TEST(test_negotiation_agrees_on_1_0_for_host_ranges_containing_it) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  uint32_t pv = plugin_version(entry);
  ck_assert_msg(PMLA_VERSION_MAJOR(pv) == 1, "plugin abi_version 0x%x is not 1.x", pv);
  static const uint32_t ranges[][2] = {{V(1, 0), V(1, 0)}, {V(0, 0), V(1, 0)},
                                       {V(0, 7), V(1, 0)}, {V(1, 0), V(1, 1)},
                                       {V(1, 0), V(2, 0)}, {V(0, 1), V(9, 9)}};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    pmla_negotiation n;
    pmla_status s = negotiate_raw(entry, ranges[i][0], ranges[i][1], &n);
    uint32_t want = ranges[i][1] < pv ? ranges[i][1] : pv;
    ck_assert_msg(s == PMLA_OK, "host %x..%x: %s (%s)", ranges[i][0], ranges[i][1],
                  harness_status_name(s), n.message);
    ck_assert_msg(n.agreed_version == want, "host %x..%x: agreed %x, want %x", ranges[i][0],
                  ranges[i][1], n.agreed_version, want);
    ck_assert_ptr_nonnull(n.plugin);
    if (ranges[i][1] == V(1, 0))
      ck_assert_msg(n.agreed_version == V(1, 0), "host ..1.0 agreed %x", n.agreed_version);
  }
  dlclose(h);
}
END_TEST

START_TEST(test_negotiation_refuses_other_majors_with_a_message) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  uint32_t pv = plugin_version(entry);
  static const uint32_t ranges[][2] = {{V(2, 0), V(2, 0)}, {V(2, 0), V(2, 9)},
                                       {V(2, 3), V(3, 5)}, {V(0, 0), V(0, 0)},
                                       {V(0, 1), V(0, 0xffff)}};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    pmla_negotiation n;
    pmla_status s = negotiate_raw(entry, ranges[i][0], ranges[i][1], &n);
    ck_assert_msg(s == PMLA_ERR_VERSION, "host %x..%x: got %s, want PMLA_ERR_VERSION",
                  ranges[i][0], ranges[i][1], harness_status_name(s));
    ck_assert_msg(n.message[0] != '\0', "host %x..%x: refusal without a message", ranges[i][0],
                  ranges[i][1]);
    ck_assert_msg(memchr(n.message, '\0', sizeof n.message) != NULL, "message not terminated");
  }
  /* a host that needs a newer minor than the plugin has */
  if (PMLA_VERSION_MINOR(pv) < 0xfffe) {
    pmla_negotiation n;
    pmla_status s = negotiate_raw(entry, pv + 1, V(1, 0xffff), &n);
    ck_assert_msg(s == PMLA_ERR_VERSION, "host %x..1.65535 vs plugin %x: got %s", pv + 1, pv,
                  harness_status_name(s));
    ck_assert(n.message[0] != '\0');
  }
  /* through the registry's helper too */
  const pmla_plugin *plugin = (const pmla_plugin *)(uintptr_t)1;
  uint32_t agreed = 0xdead;
  char msg[256] = "";
  pmla_status s = pmla_negotiate(entry, V(2, 0), V(2, 5), &plugin, &agreed, msg, sizeof msg);
  ck_assert_msg(s == PMLA_ERR_VERSION, "pmla_negotiate 2.0..2.5: %s", harness_status_name(s));
  ck_assert_msg(msg[0] != '\0', "pmla_negotiate refusal without a message");
  dlclose(h);
}
END_TEST

/* A host built against 1.0 offers 1.0 only and gets 1.0 from this 1.1
 * plugin (its 1.0-sized structs are tested in t_fp8.c and t_invariance.c) */
START_TEST(test_negotiation_a_1_0_host_gets_1_0) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  pmla_negotiation n;
  pmla_status s = negotiate_raw(entry, V(1, 0), V(1, 0), &n);
  ck_assert_msg(s == PMLA_OK && n.agreed_version == V(1, 0),
                "host 1.0..1.0: %s, agreed %x (%s)", harness_status_name(s), n.agreed_version,
                n.message);
  ck_assert_msg(n.plugin && n.plugin->abi_version >= V(1, 1),
                "plugin implements %x; this suite is for a 1.1 plugin",
                n.plugin ? n.plugin->abi_version : 0);
  dlclose(h);
}
END_TEST

START_TEST(test_negotiation_wide_range_agrees_on_the_plugins_version) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  pmla_negotiation n;
  pmla_status s = negotiate_raw(entry, V(1, 0), V(3, 5), &n);
  ck_assert_msg(s == PMLA_OK, "host 1.0..3.5: %s (%s)", harness_status_name(s), n.message);
  ck_assert_msg(PMLA_VERSION_MAJOR(n.agreed_version) == 1, "agreed %x is not 1.x",
                n.agreed_version);
  ck_assert_ptr_nonnull(n.plugin);
  ck_assert_msg(n.agreed_version == n.plugin->abi_version,
                "agreed %x, plugin implements %x: should answer its highest", n.agreed_version,
                n.plugin->abi_version);
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0;
  char msg[256];
  s = pmla_negotiate(entry, V(1, 0), V(3, 5), &plugin, &agreed, msg, sizeof msg);
  ck_assert_msg(s == PMLA_OK && agreed == n.agreed_version && plugin == n.plugin,
                "pmla_negotiate 1.0..3.5: %s agreed %x", harness_status_name(s), agreed);
  dlclose(h);
}
END_TEST

START_TEST(test_negotiation_refuses_too_small_struct_size) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  static const uint32_t sizes[] = {0, 4, 16, offsetof(pmla_negotiation, message),
                                   sizeof(pmla_negotiation) - 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    pmla_negotiation n;
    memset(&n, 0, sizeof n);
    n.struct_size = sizes[i];
    n.host_min_version = V(1, 0);
    n.host_max_version = V(1, 0);
    pmla_status s = entry(&n);
    ck_assert_msg(s == PMLA_ERR_STRUCT_SIZE, "negotiation struct_size %u: got %s", sizes[i],
                  harness_status_name(s));
    ck_assert_msg(n.plugin == NULL && n.agreed_version == 0,
                  "negotiation struct_size %u: outputs written on refusal", sizes[i]);
  }
  ck_assert_msg(entry(NULL) == PMLA_ERR_INVALID_ARGUMENT, "entry(NULL) must refuse");
  dlclose(h);
}
END_TEST

START_TEST(test_negotiation_accepts_larger_struct_size) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  struct {
    pmla_negotiation n;
    unsigned char tail[200];
  } big;
  memset(&big, 0, sizeof big);
  memset(big.tail, 0xab, sizeof big.tail);
  big.n.struct_size = sizeof big;
  big.n.host_min_version = V(1, 0);
  big.n.host_max_version = V(1, 0);
  pmla_status s = entry(&big.n);
  ck_assert_msg(s == PMLA_OK, "larger negotiation struct refused: %s (%s)",
                harness_status_name(s), big.n.message);
  ck_assert_uint_eq(big.n.agreed_version, V(1, 0));
  for (size_t i = 0; i < sizeof big.tail; i++)
    ck_assert_msg(big.tail[i] == 0xab, "plugin wrote into the host's unknown tail at +%zu", i);
  dlclose(h);
}
END_TEST

START_TEST(test_plugin_descriptor_is_well_formed) {
  pmla_entry_fn entry;
  void *h = open_plugin(&entry);
  pmla_negotiation n;
  ck_assert_int_eq(negotiate_raw(entry, V(1, 0), V(1, 0), &n), PMLA_OK);
  const pmla_plugin *p = n.plugin;
  ck_assert_uint_ge(p->struct_size, sizeof(pmla_plugin));
  ck_assert_uint_eq(PMLA_VERSION_MAJOR(p->abi_version), 1);
  ck_assert_msg(p->name && p->name[0], "plugin without a name");
  ck_assert_msg(p->version && p->version[0], "plugin without a version string");
  ck_assert_msg(p->backend_count >= 2 && p->backends, "plugin has %u backends",
                p->backend_count);
  int have_cpu = 0, have_gpu = 0;
  for (uint32_t i = 0; i < p->backend_count; i++) {
    const pmla_backend *b = p->backends[i];
    ck_assert_ptr_nonnull(b);
    ck_assert_msg(b->struct_size >= sizeof(pmla_backend), "backend %u struct_size %u < %zu", i,
                  b->struct_size, sizeof(pmla_backend));
    ck_assert_uint_eq(PMLA_VERSION_MAJOR(b->abi_version), 1);
    ck_assert_msg(b->name && b->name[0] && b->description, "backend %u lacks name/description",
                  i);
    ck_assert_msg(b->init_builder && b->destroy_builder && b->query_builder &&
                      b->build_decode && b->build_sparse && b->decode && b->last_error &&
                      b->check_device_error && b->copy_buffer,
                  "backend %s has an empty 1.0 slot", b->name);
    for (uint32_t j = 0; j < i; j++)
      ck_assert_msg(strcmp(p->backends[j]->name, b->name) != 0, "backend name %s twice",
                    b->name);
    have_cpu |= strcmp(b->name, "pmla-cpu") == 0;
    have_gpu |= strcmp(b->name, "pmla") == 0;
  }
  ck_assert_msg(have_cpu && have_gpu, "plugin must carry pmla-cpu and pmla (cpu %d gpu %d)",
                have_cpu, have_gpu);
  dlclose(h);
}
END_TEST

/* ---- registry ---- */

START_TEST(test_registry_indexes_backends_by_name) {
  pmla_registry *r = open_registry(g_plugin_path);
  ck_assert_uint_ge(pmla_registry_count(r), 2);
  const pmla_backend *cpu = pmla_registry_find(r, "pmla-cpu");
  const pmla_backend *gpu = pmla_registry_find(r, "pmla");
  ck_assert_msg(cpu && gpu, "registry lacks pmla-cpu (%p) or pmla (%p)", (void *)cpu,
                (void *)gpu);
  ck_assert_str_eq(cpu->name, "pmla-cpu");
  ck_assert_str_eq(gpu->name, "pmla");
  ck_assert_ptr_null(pmla_registry_find(r, "no-such-backend"));
  ck_assert_ptr_null(pmla_registry_find(r, ""));
  int found = 0;
  for (size_t i = 0; i < pmla_registry_count(r); i++) {
    const pmla_backend *b = pmla_registry_backend(r, i);
    ck_assert_ptr_nonnull(b);
    ck_assert_msg(pmla_registry_find(r, b->name) == b, "find(%s) is not entry %zu", b->name, i);
    const char *path = pmla_registry_backend_path(r, i);
    ck_assert_msg(path && strstr(path, base_name(g_plugin_path)),
                  "backend %s path %s does not name %s", b->name, path ? path : "(null)",
                  g_plugin_path);
    ck_assert_uint_eq(pmla_registry_backend_version(r, i), PMLA_ABI_VERSION);
    found++;
  }
  ck_assert_int_ge(found, 2);
  ck_assert_ptr_null(pmla_registry_backend(r, pmla_registry_count(r)));
  /* the diagnostics name the place searched, and nothing was skipped */
  const char *diag = pmla_registry_diagnostics(r);
  char want[700];
  snprintf(want, sizeof want, "searched file %s (", g_plugin_path);
  ck_assert_msg(strncmp(diag, want, strlen(want)) == 0 && count_char(diag, '\n') == 1,
                "diagnostics should be the one line '%s...': '%s'", want, diag);
  ck_assert_str_eq(pmla_registry_search_path(r), g_plugin_path);
  pmla_registry_close(r);
  pmla_registry_close(NULL);
}
END_TEST

/* Opens a registry on `arg` with PMLA_PLUGIN_PATH set to env (NULL: unset);
 * the variable is unset again before it returns. */
static pmla_registry *open_with_env(const char *env, const char *arg) {
  if (env)
    setenv(PMLA_PLUGIN_PATH_ENV, env, 1);
  else
    unsetenv(PMLA_PLUGIN_PATH_ENV);
  pmla_registry *r = open_registry(arg);
  unsetenv(PMLA_PLUGIN_PATH_ENV);
  return r;
}

START_TEST(test_registry_reads_the_environment_before_the_argument) {
  char a[600], b[600], want[1400];
  pmla_registry *r = open_with_env(g_plugin_path, NULL);
  ck_assert_msg(pmla_registry_find(r, "pmla-cpu") != NULL, "%s=%s not scanned: %s",
                PMLA_PLUGIN_PATH_ENV, g_plugin_path, pmla_registry_diagnostics(r));
  ck_assert_str_eq(pmla_registry_search_path(r), g_plugin_path);
  pmla_registry_close(r);

  NEED_MOCK(a, "mock_dup_a"); /* "mock-dup" (dup-a) and a mock "pmla-cpu" */
  NEED_MOCK(b, "mock_dup_b"); /* "mock-dup" (dup-b) */
  /* the environment comes first: its backends shadow the argument's */
  r = open_with_env(b, a);
  ck_assert_str_eq(found_description(r, "mock-dup"), "dup-b");
  ck_assert_msg(pmla_registry_find(r, "pmla-cpu") != NULL, "the argument was not scanned");
  snprintf(want, sizeof want, "%s:%s", b, a);
  ck_assert_str_eq(pmla_registry_search_path(r), want);
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "mock-dup", line, sizeof line);
  ck_assert_msg(strstr(line, "ignored") && strstr(line, "mock_dup_a"),
                "the argument's shadowed mock-dup not diagnosed: '%s'",
                pmla_registry_diagnostics(r));
  pmla_registry_close(r);

  r = open_with_env(a, g_plugin_path); /* the env's mock pmla-cpu wins */
  ck_assert_str_eq(found_description(r, "pmla-cpu"), "mock shadowing backend");
  ck_assert_msg(pmla_registry_find(r, "pmla") != NULL, "pmla from the argument missing");
  pmla_registry_close(r);

  r = open_with_env(g_plugin_path, a); /* the env's real pmla-cpu wins */
  ck_assert_msg(strcmp(found_description(r, "pmla-cpu"), "mock shadowing backend"),
                "%s=%s should own pmla-cpu over the argument %s", PMLA_PLUGIN_PATH_ENV,
                g_plugin_path, a);
  ck_assert_str_eq(found_description(r, "mock-dup"), "dup-a");
  pmla_registry_close(r);

  /* an empty variable names nothing: the argument alone */
  r = open_with_env("", a);
  ck_assert_str_eq(pmla_registry_search_path(r), a);
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_falls_back_to_the_plugindir_only_when_no_path_is_named) {
  const char *dir = pmla_registry_plugindir();
  ck_assert_msg(dir && dir[0] == '/', "configured plugin directory '%s' is not absolute",
                dir ? dir : "(null)");
  /* the directory the same registry finds when it is named */
  pmla_registry *named = open_with_env(NULL, dir);
  static const char *const nothing[] = {NULL, "", ":", "::"};
  for (int env_set = 0; env_set < 2; env_set++)
    for (size_t i = 0; i < sizeof nothing / sizeof nothing[0]; i++) {
      pmla_registry *r = open_with_env(env_set ? ":" : NULL, nothing[i]);
      const char *diag = pmla_registry_diagnostics(r);
      ck_assert_msg(!strcmp(pmla_registry_search_path(r), dir),
                    "argument '%s'%s: searched '%s', want the plugin directory %s",
                    nothing[i] ? nothing[i] : "(NULL)", env_set ? ", env ':'" : "",
                    pmla_registry_search_path(r), dir);
      ck_assert_msg(strstr(diag, dir) && strstr(diag, "installed plugin directory"),
                    "diagnostics do not name the plugin directory %s: '%s'", dir, diag);
      ck_assert_uint_eq(pmla_registry_count(r), pmla_registry_count(named));
      for (size_t k = 0; k < pmla_registry_count(r); k++)
        ck_assert_str_eq(pmla_registry_backend(r, k)->name,
                         pmla_registry_backend(named, k)->name);
      pmla_registry_close(r);
    }
  pmla_registry_close(named);

  /* a path named by either: the plugin directory is not searched */
  pmla_registry *r = open_with_env(NULL, "/nonexistent/pmla");
  ck_assert_str_eq(pmla_registry_search_path(r), "/nonexistent/pmla");
  ck_assert_uint_eq(pmla_registry_count(r), 0);
  ck_assert_msg(!strstr(pmla_registry_diagnostics(r), "installed plugin directory"),
                "plugin directory searched though a path was named: '%s'",
                pmla_registry_diagnostics(r));
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "/nonexistent/pmla", line, sizeof line);
  ck_assert_msg(strstr(line, "no such file or directory") && strstr(line, "argument"),
                "a missing entry should be named with where it came from: '%s'", line);
  pmla_registry_close(r);
  r = open_with_env("/nonexistent/pmla-env", NULL);
  ck_assert_str_eq(pmla_registry_search_path(r), "/nonexistent/pmla-env");
  diag_line(pmla_registry_diagnostics(r), "/nonexistent/pmla-env", line, sizeof line);
  ck_assert_msg(strstr(line, PMLA_PLUGIN_PATH_ENV), "'%s' does not name %s", line,
                PMLA_PLUGIN_PATH_ENV);
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_skips_a_wrong_major_plugin) {
  char path[600];
  NEED_MOCK(path, "mock_wrong_major");
  pmla_registry *r = open_registry(path);
  ck_assert_ptr_null(pmla_registry_find(r, "mock-wrong-major"));
  ck_assert_uint_eq(pmla_registry_count(r), 0);
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "mock_wrong_major", line, sizeof line);
  ck_assert_msg(strstr(line, "skipped") && strstr(line, "PMLA_ERR_VERSION"),
                "no diagnostic naming the file and the refusal: '%s'",
                pmla_registry_diagnostics(r));
  pmla_registry_close(r);

  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_ptr_nonnull(h);
  pmla_entry_fn entry = (pmla_entry_fn)(uintptr_t)dlsym(h, PMLA_ENTRY_SYMBOL);
  ck_assert_ptr_nonnull(entry);
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0;
  char msg[256] = "";
  ck_assert_int_eq(pmla_negotiate(entry, V(1, 0), V(1, 0xffff), &plugin, &agreed, msg, sizeof msg),
                   PMLA_ERR_VERSION);
  ck_assert_msg(msg[0] != '\0', "refusal without a message");
  ck_assert_int_eq(pmla_negotiate(entry, V(1, 0), V(2, 0), &plugin, &agreed, msg, sizeof msg),
                   PMLA_OK);
  ck_assert_uint_eq(agreed, V(2, 0));
  dlclose(h);
}
END_TEST

START_TEST(test_registry_accepts_an_older_minor_plugin) {
  char path[600];
  NEED_MOCK(path, "mock_old_minor");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_ptr_nonnull(h);
  pmla_entry_fn entry = (pmla_entry_fn)(uintptr_t)dlsym(h, PMLA_ENTRY_SYMBOL);
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0;
  char msg[256];
  pmla_status s = pmla_negotiate(entry, V(1, 0), V(1, 9), &plugin, &agreed, msg, sizeof msg);
  ck_assert_msg(s == PMLA_OK && agreed == V(1, 0) && plugin,
                "1.0 plugin vs host 1.0..1.9: %s agreed %x", harness_status_name(s), agreed);
  dlclose(h);

  pmla_registry *r = open_registry(path);
  const pmla_backend *b = pmla_registry_find(r, "mock-old-minor");
  ck_assert_msg(b != NULL, "older-minor plugin skipped: %s", pmla_registry_diagnostics(r));
  ck_assert_uint_eq(pmla_registry_backend_version(r, 0), V(1, 0));
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_agrees_host_version_with_a_newer_minor_plugin) {
  char path[600];
  NEED_MOCK(path, "mock_new_minor");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_ptr_nonnull(h);
  pmla_entry_fn entry = (pmla_entry_fn)(uintptr_t)dlsym(h, PMLA_ENTRY_SYMBOL);
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0;
  char msg[256];
  ck_assert_int_eq(pmla_negotiate(entry, V(1, 0), V(1, 9), &plugin, &agreed, msg, sizeof msg),
                   PMLA_OK);
  ck_assert_uint_eq(agreed, V(1, 2));
  dlclose(h);

  pmla_registry *r = open_registry(path);
  ck_assert_msg(pmla_registry_find(r, "mock-new-minor") != NULL, "1.2 plugin skipped: %s",
                pmla_registry_diagnostics(r));
  ck_assert_msg(pmla_registry_backend_version(r, 0) == PMLA_ABI_VERSION,
                "registry (host %x) agreed %x with a 1.2 plugin", PMLA_ABI_VERSION,
                pmla_registry_backend_version(r, 0));
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_skips_a_truncated_vtable) {
  char path[600];
  NEED_MOCK(path, "mock_short_vtable");
  pmla_registry *r = open_registry(path);
  ck_assert_msg(pmla_registry_find(r, "mock-short") == NULL,
                "backend with struct_size %zu < %zu was registered",
                offsetof(pmla_backend, copy_buffer), sizeof(pmla_backend));
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "mock_short_vtable", line, sizeof line);
  ck_assert_msg(strstr(line, "truncated"), "no diagnostic for the truncated vtable: '%s'",
                pmla_registry_diagnostics(r));
  pmla_registry_close(r);
}
END_TEST

/* A library that only links a plugin is not that plugin: its handle finds
 * the plugin's entry point among its dependencies, but the entry point is
 * not its own. The plugin named after it is still loaded from its own file. */
START_TEST(test_registry_skips_a_library_that_only_links_a_plugin) {
  char links[600], old_minor[600], path[1300];
  NEED_MOCK(links, "mock_links_plugin");
  NEED_MOCK(old_minor, "mock_old_minor");
  snprintf(path, sizeof path, "%s:%s", links, old_minor);
  pmla_registry *r = open_registry(path);
  const char *diag = pmla_registry_diagnostics(r);
  char line[1024];
  diag_line(diag, "is not its own", line, sizeof line);
  ck_assert_msg(strstr(line, "skipped") && strstr(line, "mock_links_plugin"),
                "the linking library, not diagnosed as such: '%s'", diag);
  ck_assert_uint_eq(pmla_registry_count(r), 1);
  const char *from = pmla_registry_backend_path(r, 0);
  ck_assert_ptr_nonnull(pmla_registry_find(r, "mock-old-minor"));
  ck_assert_msg(from && strstr(from, "mock_old_minor"), "mock-old-minor came from %s: '%s'",
                from ? from : "(nowhere)", diag);
  pmla_registry_close(r);
}
END_TEST

/* A FIFO named like a plugin, in a directory or named itself, is skipped
 * with a line: opening it would wait for a writer forever. */
START_TEST(test_registry_skips_a_fifo_without_opening_it) {
  char old_minor[600];
  tmpdir t;
  tmpdir_make(&t);
  const char *fifo = tmpdir_file(&t, "stale.so");
  ck_assert_msg(mkfifo(fifo, 0600) == 0, "mkfifo %s failed", fifo);
  int have_om = harness_mock_path("mock_old_minor", old_minor, sizeof old_minor) == 0;
  if (have_om)
    tmpdir_link(&t, "zz-good.so", old_minor);
  char path[1300];
  snprintf(path, sizeof path, "%s:%s", t.path, fifo);
  pmla_registry *r = open_registry(path);
  const char *diag = pmla_registry_diagnostics(r);
  char needle[700];
  snprintf(needle, sizeof needle, "skipped %s: not a regular file", fifo);
  const char *first = strstr(diag, needle);
  ck_assert_msg(first && strstr(first + 1, needle), "the FIFO, twice on the path: '%s'", diag);
  if (have_om)
    ck_assert_msg(pmla_registry_find(r, "mock-old-minor") != NULL,
                  "the plugin beside the FIFO was not loaded: '%s'", diag);
  pmla_registry_close(r);
  tmpdir_remove(&t);
}
END_TEST

START_TEST(test_registry_skips_non_plugins_and_garbage_files) {
  char not_plugin[600], old_minor[600];
  tmpdir t;
  tmpdir_make(&t);
  tmpdir_write(&t, "x.so", "this is not an ELF object\n");
  tmpdir_write(&t, "empty.so", "");
  tmpdir_link(&t, "dangling.so", "/nonexistent/pmla/target.so");
  tmpdir_write(&t, "line\nbreak.so", "not an ELF object either\n");
  int have_np = harness_mock_path("mock_not_plugin", not_plugin, sizeof not_plugin) == 0;
  int have_om = harness_mock_path("mock_old_minor", old_minor, sizeof old_minor) == 0;
  if (have_np)
    tmpdir_link(&t, "np.so", not_plugin);
  if (have_om) {
    tmpdir_link(&t, "zz-good.so", old_minor);
    tmpdir_link(&t, "plugin.txt", g_plugin_path); /* not *.so: never loaded */
  }
  char path[2800];
  snprintf(path, sizeof path, "%s:/nonexistent/pmla/dir::%s/missing.so:%s/x.so/inner.so", t.path,
           t.path, t.path);
  pmla_registry *r = open_registry(path);
  const char *diag = pmla_registry_diagnostics(r);
  ck_assert_msg(strstr(diag, "x.so"), "garbage x.so not diagnosed: '%s'", diag);
  ck_assert_msg(strstr(diag, "empty.so"), "empty empty.so not diagnosed: '%s'", diag);
  char line[1024];
  diag_line(diag, "x.so", line, sizeof line);
  ck_assert_msg(strstr(line, "x.so: not a pmla plugin (not a shared library)"),
                "x.so should be called no shared library: '%s'", diag);
  diag_line(diag, "dangling.so", line, sizeof line);
  ck_assert_msg(strstr(line, "skipped") && strstr(line, strerror(ENOENT)),
                "dangling.so should be called missing: '%s'", diag);
  diag_line(diag, "break.so", line, sizeof line); /* one line per event, whatever the name */
  ck_assert_msg(strncmp(line, "skipped ", 8) == 0 && strstr(line, "line?break.so: not a pmla"),
                "a file name's newline should read as '?' within its one line: '%s'", diag);
  diag_line(diag, "inner.so", line, sizeof line); /* a path through a file */
  ck_assert_msg(strstr(line, "skipped") && strstr(line, strerror(ENOTDIR)),
                "x.so/inner.so should be called not a directory: '%s'", diag);
  if (have_np) {
    diag_line(diag, "np.so", line, sizeof line);
    ck_assert_msg(strstr(line, "np.so: not a pmla plugin (no " PMLA_ENTRY_SYMBOL " symbol)"),
                  "non-plugin np.so not diagnosed plainly: '%s'", diag);
  }
  if (have_om) {
    ck_assert_msg(pmla_registry_find(r, "mock-old-minor") != NULL,
                  "the good plugin after the bad files was not loaded: '%s'", diag);
    ck_assert_msg(pmla_registry_find(r, "pmla-cpu") == NULL,
                  "plugin.txt (not *.so) was loaded from a directory");
    ck_assert_uint_eq(pmla_registry_count(r), 1);
  } else {
    ck_assert_uint_eq(pmla_registry_count(r), 0);
  }
  pmla_registry_close(r);
  tmpdir_remove(&t);
  if (!have_np || !have_om)
    printf("NOTE %s: mock plugins missing, ran the garbage-file part only\n", __func__);
}
END_TEST

START_TEST(test_registry_duplicate_names_resolve_to_the_first_on_the_path) {
  char a[600], b[600], path[1400];
  NEED_MOCK(a, "mock_dup_a");
  NEED_MOCK(b, "mock_dup_b");
  snprintf(path, sizeof path, "%s:%s", a, b);
  for (int round = 0; round < 3; round++) { /* deterministic */
    pmla_registry *r = open_registry(path);
    const pmla_backend *be = pmla_registry_find(r, "mock-dup");
    ck_assert_ptr_nonnull(be);
    ck_assert_str_eq(be->description, "dup-a");
    ck_assert_msg(strstr(pmla_registry_diagnostics(r), "mock-dup"),
                  "shadowed name not diagnosed: '%s'", pmla_registry_diagnostics(r));
    pmla_registry_close(r);
  }
  snprintf(path, sizeof path, "%s:%s", b, a);
  pmla_registry *r = open_registry(path);
  ck_assert_str_eq(found_description(r, "mock-dup"), "dup-b");
  pmla_registry_close(r);

  /* against the real plugin: whoever is first owns "pmla-cpu" */
  snprintf(path, sizeof path, "%s:%s", g_plugin_path, a);
  r = open_registry(path);
  ck_assert_msg(strcmp(found_description(r, "pmla-cpu"), "mock shadowing backend"),
                "the real plugin first on the path must own pmla-cpu");
  pmla_registry_close(r);
  snprintf(path, sizeof path, "%s:%s", a, g_plugin_path);
  r = open_registry(path);
  ck_assert_str_eq(found_description(r, "pmla-cpu"), "mock shadowing backend");
  ck_assert_msg(pmla_registry_find(r, "pmla") != NULL, "pmla from the second plugin missing");
  pmla_registry_close(r);

  /* in a directory, *.so files are taken in name order */
  tmpdir t;
  tmpdir_make(&t);
  tmpdir_link(&t, "10-first.so", b);
  tmpdir_link(&t, "20-second.so", a);
  r = open_registry(t.path);
  ck_assert_str_eq(found_description(r, "mock-dup"), "dup-b");
  pmla_registry_close(r);
  tmpdir_remove(&t);

  /* the same file twice on the path: no crash, still resolvable */
  snprintf(path, sizeof path, "%s:%s", a, a);
  r = open_registry(path);
  ck_assert_str_eq(found_description(r, "mock-dup"), "dup-a");
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_negotiation_message_without_a_nul_is_copied_bounded_and_flagged) {
  char path[600];
  NEED_MOCK(path, "mock_unterminated_message");
  pmla_entry_fn entry;
  void *h = open_file(path, &entry);
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0xdead;
  char msg[1024];
  memset(msg, 0, sizeof msg);
  pmla_status s = pmla_negotiate(entry, V(1, 0), V(1, 0), &plugin, &agreed, msg, sizeof msg);
  ck_assert_msg(s == PMLA_ERR_VERSION, "got %s, want the plugin's PMLA_ERR_VERSION",
                harness_status_name(s));
  ck_assert_msg(plugin == NULL && agreed == 0xdead, "outputs written on a refusal");
  ck_assert_msg(count_char(msg, '#') == NEGOTIATION_MESSAGE_BYTES,
                "copied %zu bytes of a %zu-byte message without a NUL: '%s'",
                count_char(msg, '#'), NEGOTIATION_MESSAGE_BYTES, msg);
  ck_assert_msg(strstr(msg, "NUL"), "message does not say it lacked a NUL: '%s'", msg);
  char small[16];
  memset(small, 'z', sizeof small);
  pmla_negotiate(entry, V(1, 0), V(1, 0), &plugin, &agreed, small, sizeof small);
  ck_assert_msg(memchr(small, '\0', sizeof small), "message of 16 bytes not terminated");
  dlclose(h);

  pmla_registry *r = open_registry(path);
  ck_assert_uint_eq(pmla_registry_count(r), 0);
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "mock_unterminated_message", line, sizeof line);
  ck_assert_msg(strstr(line, "NUL"), "diagnostic does not say the message lacked a NUL: '%s'",
                pmla_registry_diagnostics(r));
  ck_assert_msg(count_char(line, '#') == NEGOTIATION_MESSAGE_BYTES,
                "diagnostic holds %zu bytes of the %zu-byte message: '%s'", count_char(line, '#'),
                NEGOTIATION_MESSAGE_BYTES, line);
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_says_a_plugin_answered_ok_without_a_descriptor) {
  char path[600];
  NEED_MOCK(path, "mock_null_plugin");
  pmla_entry_fn entry;
  void *h = open_file(path, &entry);
  const pmla_plugin *plugin = (const pmla_plugin *)(uintptr_t)1;
  uint32_t agreed = 0xdead;
  char msg[512] = "";
  pmla_status s = pmla_negotiate(entry, V(1, 0), V(1, 0), &plugin, &agreed, msg, sizeof msg);
  ck_assert_msg(s != PMLA_OK && s != PMLA_ERR_VERSION,
                "PMLA_OK without a descriptor gave %s: '%s'", harness_status_name(s), msg);
  ck_assert_msg(plugin == (const pmla_plugin *)(uintptr_t)1 && agreed == 0xdead,
                "outputs written on a refusal");
  ck_assert_msg(strstr(msg, "no plugin descriptor"), "message: '%s'", msg);
  dlclose(h);

  pmla_registry *r = open_registry(path);
  ck_assert_uint_eq(pmla_registry_count(r), 0);
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "mock_null_plugin", line, sizeof line);
  ck_assert_msg(strstr(line, "answered PMLA_OK but returned no plugin descriptor"),
                "diagnostic: '%s'", pmla_registry_diagnostics(r));
  ck_assert_msg(!strstr(line, "version"), "reported as a version mismatch: '%s'", line);
  pmla_registry_close(r);
}
END_TEST

/* A descriptor whose backends array is NULL, or that lists no backends,
 * loads nothing and says which. */
static const struct {
  const char *mock, *says;
} lacking[] = {
    {"mock_null_backends", "lists 2 backends but the backends array is NULL"},
    {"mock_no_backends", "lists no backends"},
};
#define N_LACKING ((int)(sizeof lacking / sizeof lacking[0]))

START_TEST(test_registry_says_what_a_descriptor_lacks) {
  char path[600];
  NEED_MOCK(path, lacking[_i].mock);
  pmla_registry *r = open_registry(path);
  ck_assert_uint_eq(pmla_registry_count(r), 0);
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), lacking[_i].says, line, sizeof line);
  ck_assert_msg(strstr(line, "skipped") && strstr(line, lacking[_i].mock),
                "diagnostic: '%s'", pmla_registry_diagnostics(r));
  ck_assert_msg(!strstr(line, "truncated"), "reported as truncated: '%s'", line);
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_skips_null_unnamed_and_incomplete_backends_alone) {
  char path[600];
  NEED_MOCK(path, "mock_unnamed_backends");
  pmla_registry *r = open_registry(path);
  const char *diag = pmla_registry_diagnostics(r);
  ck_assert_msg(pmla_registry_find(r, "mock-named") != NULL,
                "the good backend after the bad ones was dropped: '%s'", diag);
  ck_assert_uint_eq(pmla_registry_count(r), 1);
  ck_assert_ptr_null(pmla_registry_find(r, ""));
  char line[1024];
  diag_line(diag, "backend #0 ", line, sizeof line);
  ck_assert_msg(strstr(line, "mock_unnamed_backends") && strstr(line, "NULL"),
                "NULL backend #0: '%s'", diag);
  diag_line(diag, "backend #1 ", line, sizeof line);
  ck_assert_msg(strstr(line, "mock_unnamed_backends") && strstr(line, "has no name"),
                "backend #1 with a NULL name: '%s'", diag);
  diag_line(diag, "backend #2 ", line, sizeof line);
  ck_assert_msg(strstr(line, "mock_unnamed_backends") && strstr(line, "empty name"),
                "backend #2 named \"\": '%s'", diag);
  ck_assert_ptr_null(pmla_registry_find(r, "mock-no-decode"));
  diag_line(diag, "backend #3 ", line, sizeof line);
  ck_assert_msg(strstr(line, "mock-no-decode") && strstr(line, "decode function is NULL"),
                "backend #3 whose decode is NULL: '%s'", diag);
  ck_assert_msg(!strstr(diag, "truncated"), "reported as truncated: '%s'", diag);
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_name_listed_twice_in_one_plugin_keeps_the_first) {
  char path[600];
  NEED_MOCK(path, "mock_dup_within");
  pmla_registry *r = open_registry(path);
  const pmla_backend *b = pmla_registry_find(r, "mock-twice");
  ck_assert_ptr_nonnull(b);
  ck_assert_str_eq(b->description, "first");
  ck_assert_uint_eq(pmla_registry_count(r), 1);
  char line[1024];
  diag_line(pmla_registry_diagnostics(r), "mock-twice", line, sizeof line);
  ck_assert_msg(strstr(line, "mock_dup_within") && strstr(line, "#0") && strstr(line, "#1"),
                "diagnostic should name the file and both entries: '%s'",
                pmla_registry_diagnostics(r));
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_shadowed_name_diagnostic_names_both_files) {
  char a[600], b[600], path[1400], line[1024];
  NEED_MOCK(a, "mock_dup_a");
  NEED_MOCK(b, "mock_dup_b");
  snprintf(path, sizeof path, "%s:%s", b, a);
  pmla_registry *r = open_registry(path);
  ck_assert_str_eq(found_description(r, "mock-dup"), "dup-b");
  diag_line(pmla_registry_diagnostics(r), "mock-dup", line, sizeof line);
  ck_assert_msg(strstr(line, "mock_dup_a") && strstr(line, "mock_dup_b"),
                "diagnostic should name the shadowed and the winning file: '%s'",
                pmla_registry_diagnostics(r));
  pmla_registry_close(r);

  snprintf(path, sizeof path, "%s:%s", g_plugin_path, a);
  r = open_registry(path);
  diag_line(pmla_registry_diagnostics(r), "pmla-cpu", line, sizeof line);
  ck_assert_msg(strstr(line, "mock_dup_a") && strstr(line, base_name(g_plugin_path)),
                "diagnostic should name both files: '%s'", pmla_registry_diagnostics(r));
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_registry_refuses_a_backend_count_beyond_its_limit) {
  char path[600];
  NEED_MOCK(path, "mock_huge_count");
  pmla_registry *r = open_registry(path);
  ck_assert_ptr_null(pmla_registry_find(r, "mock-huge"));
  ck_assert_uint_eq(pmla_registry_count(r), 0);
  char line[1024], limit[32];
  snprintf(limit, sizeof limit, "%u", (unsigned)PMLA_REGISTRY_MAX_BACKENDS);
  diag_line(pmla_registry_diagnostics(r), "mock_huge_count", line, sizeof line);
  ck_assert_msg(strstr(line, "4294967295") && strstr(line, limit),
                "diagnostic should name the count 4294967295 and the limit %s: '%s'", limit,
                pmla_registry_diagnostics(r));
  pmla_registry_close(r);
}
END_TEST

/* A plugin file cut off inside its segments (a copy not finished) is
 * skipped with the reason; dlopen would map past its end and the host die of
 * SIGBUS at the first touch. */
START_TEST(test_registry_skips_a_shared_library_cut_short) {
  char old_minor[600], dup_b[600];
  NEED_MOCK(old_minor, "mock_old_minor");
  NEED_MOCK(dup_b, "mock_dup_b");
  tmpdir t;
  tmpdir_make(&t);
  FILE *in = fopen(old_minor, "rb");
  ck_assert_ptr_nonnull(in);
  static char bytes[1 << 16];
  const size_t n = fread(bytes, 1, sizeof bytes, in);
  fclose(in);
  ck_assert_msg(n > 5000 && n < sizeof bytes, "mock_old_minor.so is %zu bytes", n);
  FILE *out = fopen(tmpdir_file(&t, "cut.so"), "wb");
  ck_assert_ptr_nonnull(out);
  ck_assert_uint_eq(fwrite(bytes, 1, 5000, out), 5000);
  fclose(out);
  out = fopen(tmpdir_file(&t, "head.so"), "wb"); /* the magic, not the whole header */
  ck_assert_ptr_nonnull(out);
  ck_assert_uint_eq(fwrite(bytes, 1, 20, out), 20);
  fclose(out);
  tmpdir_link(&t, "zz-good.so", dup_b);
  pmla_registry *r = open_registry(t.path);
  const char *diag = pmla_registry_diagnostics(r);
  char line[1024];
  diag_line(diag, "cut.so", line, sizeof line);
  ck_assert_msg(strstr(line, "cut.so: a shared library cut short"), "cut.so: '%s'", diag);
  diag_line(diag, "head.so", line, sizeof line);
  ck_assert_msg(strstr(line, "head.so: a shared library cut short: 20 bytes"), "head.so: '%s'",
                diag);
  ck_assert_msg(pmla_registry_find(r, "mock-old-minor") == NULL, "cut.so was loaded");
  ck_assert_msg(pmla_registry_find(r, "mock-dup") != NULL, "the plugin beside it: '%s'", diag);
  pmla_registry_close(r);
  tmpdir_remove(&t);
}
END_TEST

/* A path entry without a slash is the file in the current directory, as a
 * shell reads it; dlopen alone would search LD_LIBRARY_PATH instead. */
START_TEST(test_registry_reads_a_bare_file_name_in_the_current_directory) {
  char old_minor[600], cwd[4096];
  NEED_MOCK(old_minor, "mock_old_minor");
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  tmpdir t;
  tmpdir_make(&t);
  tmpdir_link(&t, "bare-plugin.so", old_minor);
  ck_assert_int_eq(chdir(t.path), 0);
  pmla_registry *r = open_registry("bare-plugin.so");
  const int found = pmla_registry_find(r, "mock-old-minor") != NULL;
  char diag[2048];
  snprintf(diag, sizeof diag, "%s", pmla_registry_diagnostics(r));
  pmla_registry_close(r);
  ck_assert_int_eq(chdir(cwd), 0);
  tmpdir_remove(&t);
  ck_assert_msg(found, "bare-plugin.so in the current directory not loaded: '%s'", diag);
}
END_TEST

/* One file reached twice (a repeated path entry, a link) is read once, and
 * a repeated directory is searched once. */
START_TEST(test_registry_reads_a_file_or_directory_once) {
  char old_minor[600];
  NEED_MOCK(old_minor, "mock_old_minor");
  tmpdir t;
  tmpdir_make(&t);
  tmpdir_link(&t, "a.so", old_minor);
  tmpdir_link(&t, "b.so", old_minor);
  char path[2400];
  snprintf(path, sizeof path, "%s:%s:%s", t.path, t.path, old_minor);
  pmla_registry *r = open_registry(path);
  const char *diag = pmla_registry_diagnostics(r);
  char line[1024];
  ck_assert_uint_eq(pmla_registry_count(r), 1);
  diag_line(diag, "b.so", line, sizeof line);
  ck_assert_msg(strstr(line, "b.so: the same file was read before"), "b.so: '%s'", diag);
  ck_assert_msg(strstr(diag, "searched before on this path"), "the second %s: '%s'", t.path,
                diag);
  pmla_registry_close(r);
  tmpdir_remove(&t);
}
END_TEST

/* Diagnostics stop at 64 KiB, with a last line counting the rest. */
START_TEST(test_registry_diagnostics_are_bounded) {
  enum { ENTRIES = 3000 };
  char *path = malloc(ENTRIES * 32);
  ck_assert_ptr_nonnull(path);
  size_t len = 0;
  for (int i = 0; i < ENTRIES; i++)
    len += (size_t)sprintf(path + len, "%s/nonexistent/pmla-%04d", i ? ":" : "", i);
  pmla_registry *r = open_registry(path);
  free(path);
  const char *diag = pmla_registry_diagnostics(r);
  const size_t n = strlen(diag);
  ck_assert_msg(n <= 64 * 1024 + 128, "%zu bytes of diagnostics", n);
  ck_assert_msg(strstr(diag, "more lines not kept (diagnostics stop at 65536 bytes)"),
                "no line counts what was left out: '...%s'", diag + (n > 200 ? n - 200 : 0));
  ck_assert_msg(strstr(diag, "pmla-0000"), "the first entry's line is gone");
  pmla_registry_close(r);
}
END_TEST

/* Backends a host cannot use are skipped alone: a name past
 * PMLA_REGISTRY_MAX_NAME bytes, another major; one that implements an older
 * minor than its plugin agreed is indexed at its own version. */
START_TEST(test_registry_skips_odd_backends_alone_and_keeps_each_ones_version) {
  char odd[600];
  NEED_MOCK(odd, "mock_odd_backends");
  pmla_registry *r = open_registry(odd);
  const char *diag = pmla_registry_diagnostics(r);
  ck_assert_msg(strstr(diag, "backend #0 of") && strstr(diag, "its name is longer than 256"),
                "the 300-byte name: '%s'", diag);
  ck_assert_msg(strstr(diag, "\"mock-other-major\"") && strstr(diag, "implements ABI 2.0"),
                "the 2.0 backend: '%s'", diag);
  ck_assert_ptr_null(pmla_registry_find(r, "mock-other-major"));
  ck_assert_uint_eq(pmla_registry_count(r), 2);
  for (size_t i = 0; i < 2; i++) {
    const char *name = pmla_registry_backend(r, i)->name;
    const uint32_t want = strcmp(name, "mock-older-backend") == 0 ? V(1, 0) : V(1, 1);
    ck_assert_msg(pmla_registry_backend_version(r, i) == want, "%s indexed at %x, want %x",
                  name, pmla_registry_backend_version(r, i), want);
  }
  pmla_registry_close(r);
}
END_TEST

START_TEST(test_negotiate_refuses_null_arguments_with_a_message) {
  const pmla_plugin *plugin = NULL;
  uint32_t agreed = 0;
  char msg[128];
  ck_assert_int_eq(pmla_negotiate(NULL, V(1, 0), V(1, 1), &plugin, &agreed, msg, sizeof msg),
                   PMLA_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(msg, "entry is NULL"), "message '%s'", msg);
}
END_TEST

START_TEST(test_status_names_are_distinct) {
  for (int i = PMLA_OK; i <= PMLA_ERR_INTERNAL; i++) {
    const char *a = pmla_status_name((pmla_status)i);
    ck_assert_msg(a && a[0], "pmla_status_name(%d) empty", i);
    for (int j = PMLA_OK; j < i; j++)
      ck_assert_msg(strcmp(a, pmla_status_name((pmla_status)j)) != 0,
                    "status %d and %d share the name %s", i, j, a);
  }
  ck_assert_ptr_nonnull(pmla_status_name((pmla_status)999));
}
END_TEST

Suite *suite_abi(void) {
  Suite *s = suite_create("abi");
  TCase *tc = tcase_create("plugin");
  tcase_add_test(tc, test_plugin_exports_exactly_the_entry_symbol);
  tcase_add_test(tc, test_version_macro_is_defined_for_majors_with_the_top_bit_set);
  tcase_add_test(tc, test_negotiation_agrees_on_1_0_for_host_ranges_containing_it);
  tcase_add_test(tc, test_negotiation_refuses_other_majors_with_a_message);
  tcase_add_test(tc, test_negotiation_a_1_0_host_gets_1_0);
  tcase_add_test(tc, test_negotiation_wide_range_agrees_on_the_plugins_version);
  tcase_add_test(tc, test_negotiation_refuses_too_small_struct_size);
  tcase_add_test(tc, test_negotiation_accepts_larger_struct_size);
  tcase_add_test(tc, test_plugin_descriptor_is_well_formed);
  suite_add_tcase(s, tc);
  tc = tcase_create("registry");
  tcase_add_test(tc, test_registry_indexes_backends_by_name);
  tcase_add_test(tc, test_registry_reads_the_environment_before_the_argument);
  tcase_add_test(tc, test_registry_falls_back_to_the_plugindir_only_when_no_path_is_named);
  tcase_add_test(tc, test_registry_skips_a_wrong_major_plugin);
  tcase_add_test(tc, test_registry_accepts_an_older_minor_plugin);
  tcase_add_test(tc, test_registry_agrees_host_version_with_a_newer_minor_plugin);
  tcase_add_test(tc, test_registry_skips_a_truncated_vtable);
  tcase_add_test(tc, test_registry_skips_non_plugins_and_garbage_files);
  tcase_add_test(tc, test_registry_duplicate_names_resolve_to_the_first_on_the_path);
  tcase_add_test(tc, test_negotiation_message_without_a_nul_is_copied_bounded_and_flagged);
  tcase_add_test(tc, test_registry_says_a_plugin_answered_ok_without_a_descriptor);
  tcase_add_loop_test(tc, test_registry_says_what_a_descriptor_lacks, 0, N_LACKING);
  tcase_add_test(tc, test_registry_skips_null_unnamed_and_incomplete_backends_alone);
  tcase_add_test(tc, test_registry_skips_a_fifo_without_opening_it);
  tcase_add_test(tc, test_registry_skips_a_library_that_only_links_a_plugin);
  tcase_add_test(tc, test_registry_name_listed_twice_in_one_plugin_keeps_the_first);
  tcase_add_test(tc, test_registry_shadowed_name_diagnostic_names_both_files);
  tcase_add_test(tc, test_registry_refuses_a_backend_count_beyond_its_limit);
  tcase_add_test(tc, test_registry_skips_a_shared_library_cut_short);
  tcase_add_test(tc, test_registry_reads_a_bare_file_name_in_the_current_directory);
  tcase_add_test(tc, test_registry_reads_a_file_or_directory_once);
  tcase_add_test(tc, test_registry_diagnostics_are_bounded);
  tcase_add_test(tc, test_registry_skips_odd_backends_alone_and_keeps_each_ones_version);
  tcase_add_test(tc, test_negotiate_refuses_null_arguments_with_a_message);
  tcase_add_test(tc, test_status_names_are_distinct);
  suite_add_tcase(s, tc);
  return s;
}
