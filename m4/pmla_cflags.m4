dnl SPDX-License-Identifier: MIT
# PMLA_CHECK_VISIBILITY: VISIBILITY_CFLAGS=-fvisibility=hidden when the C
# compiler takes it (the plugin then exports only its entry point).
AC_DEFUN([PMLA_CHECK_VISIBILITY], [
  AC_CACHE_CHECK([whether $CC accepts -fvisibility=hidden], [pmla_cv_visibility], [
    pmla_save_CFLAGS=$CFLAGS
    CFLAGS="$CFLAGS -fvisibility=hidden -Werror"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[__attribute__((visibility("default"))) int f(void);]], [[]])],
      [pmla_cv_visibility=yes], [pmla_cv_visibility=no])
    CFLAGS=$pmla_save_CFLAGS])
  VISIBILITY_CFLAGS=
  AS_IF([test "$pmla_cv_visibility" = yes], [VISIBILITY_CFLAGS=-fvisibility=hidden])
  AC_SUBST([VISIBILITY_CFLAGS])
])

# PMLA_WARNINGS: WARN_CFLAGS, the warning set every C file builds with.
AC_DEFUN([PMLA_WARNINGS], [
  WARN_CFLAGS="-Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla"
  AC_SUBST([WARN_CFLAGS])
])
