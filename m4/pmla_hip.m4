dnl SPDX-License-Identifier: MIT
# PMLA_CHECK_HIP: the GPU platform for the `pmla` backend.
#   --with-hip=nvidia|amd|no   (default: detect; nvcc first, then hipcc)
#   --with-gpu-arch=LIST       NVIDIA default sm_90a; AMD default "gfx90a gfx940"
#   --with-cuda=DIR            CUDA toolkit (default: from nvcc's location)
# Sets GPU_PLATFORM (nvidia|amd|none), GPU_COMPILE (compiler + flags for the
# HIP sources), GPU_CPPFLAGS / GPU_LIBS (runtime API for the C side), and the
# conditionals PMLA_GPU, PMLA_GPU_NVIDIA, PMLA_GPU_AMD.
AC_DEFUN([PMLA_CHECK_HIP], [
  AC_ARG_WITH([hip],
    [AS_HELP_STRING([--with-hip=nvidia|amd|no], [GPU platform of the pmla backend (default: detect)])],
    [], [with_hip=detect])
  AC_ARG_WITH([gpu-arch],
    [AS_HELP_STRING([--with-gpu-arch=LIST], [GPU targets, space or comma separated (NVIDIA: sm_90a; AMD: gfx90a gfx940)])],
    [], [with_gpu_arch=])
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda=DIR], [CUDA toolkit root for --with-hip=nvidia])],
    [], [with_cuda=])
  AC_ARG_VAR([NVCC], [CUDA compiler for --with-hip=nvidia])
  AC_ARG_VAR([HIPCC], [HIP compiler for --with-hip=amd])

  AS_IF([test -n "$with_cuda"], [pmla_nvcc_path="$with_cuda/bin$PATH_SEPARATOR$PATH"],
        [pmla_nvcc_path="$PATH$PATH_SEPARATOR/usr/local/cuda/bin"])
  AC_PATH_PROG([NVCC], [nvcc], [], [$pmla_nvcc_path])
  AC_PATH_PROG([HIPCC], [hipcc], [])

  AS_CASE([$with_hip],
    [detect], [AS_IF([test -n "$NVCC"], [with_hip=nvidia],
                     [test -n "$HIPCC"], [with_hip=amd], [with_hip=no])],
    [yes], [AS_IF([test -n "$NVCC"], [with_hip=nvidia], [with_hip=amd])],
    [nvidia|amd|no], [],
    [AC_MSG_ERROR([--with-hip=$with_hip: accepted values are nvidia, amd, no])])

  GPU_PLATFORM=none
  GPU_COMPILE=
  GPU_CPPFLAGS=
  GPU_LIBS=
  pmla_arch_list=`echo "$with_gpu_arch" | tr ',' ' '`
  AS_CASE([$with_hip],
    [nvidia], [
      AS_IF([test -z "$NVCC"], [AC_MSG_ERROR([--with-hip=nvidia needs nvcc (set NVCC or --with-cuda)])])
      AS_IF([test -z "$with_cuda"], [
        # nvcc is often a wrapper script or a symlink (/usr/local/bin/nvcc):
        # ask it where its toolkit is rather than guessing from its path.
        AC_MSG_CHECKING([for the CUDA toolkit of $NVCC])
        echo > conftest.cu
        with_cuda=`$NVCC --dryrun -c conftest.cu -o conftest.$OBJEXT 2>&1 | sed -n 's/^.* TOP=//p' | sed 1q`
        rm -f conftest.cu conftest.$OBJEXT
        AS_IF([test -n "$with_cuda" && test -d "$with_cuda"],
              [with_cuda=`cd "$with_cuda" && pwd -P`],
              [with_cuda=`dirname "$NVCC"`; with_cuda=`dirname "$with_cuda"`])
        AC_MSG_RESULT([$with_cuda])])
      # headers and libcudart: include/ and lib64/ (or lib/), or only under
      # targets/<arch>-linux/ in some packagings
      pmla_cuda_incdir=
      for d in "$with_cuda/include" "$with_cuda"/targets/*/include; do
        AS_IF([test -z "$pmla_cuda_incdir" && test -f "$d/cuda_runtime_api.h"], [pmla_cuda_incdir=$d])
      done
      AS_IF([test -n "$pmla_cuda_incdir"], [],
            [AC_MSG_ERROR([no cuda_runtime_api.h under $with_cuda/include (or $with_cuda/targets/*/include): give the toolkit root with --with-cuda=DIR, or build without a GPU backend with --with-hip=no])])
      pmla_cuda_libdir=
      for d in "$with_cuda/lib64" "$with_cuda/lib" "$with_cuda"/targets/*/lib; do
        AS_IF([test -z "$pmla_cuda_libdir" && test -d "$d"], [pmla_cuda_libdir=$d])
      done
      AS_IF([test -n "$pmla_cuda_libdir"], [], [pmla_cuda_libdir="$with_cuda/lib64"])
      AS_IF([test -z "$pmla_arch_list"], [pmla_arch_list=sm_90a])
      pmla_gencode=
      for a in $pmla_arch_list; do
        # An sm_90 image has no wgmma body (it needs sm_90a's features), yet
        # the runtime reports it as sm_90 code, the same as sm_90a's, so an
        # H100/H200 would run its empty 64-row kernels.
        AS_CASE([$a],
          [sm_90], [AC_MSG_ERROR([--with-gpu-arch: sm_90 builds no wgmma body; accepted for H100/H200: sm_90a])],
          [sm_[[0-9]]*], [],
          [AC_MSG_ERROR([--with-gpu-arch: '$a' is not an NVIDIA target; accepted: sm_NN or sm_NNa, e.g. sm_90a sm_80])])
        n=`echo "$a" | sed 's/^sm_//'`
        pmla_gencode="$pmla_gencode -gencode arch=compute_$n,code=sm_$n"
      done
      GPU_PLATFORM=nvidia
      GPU_COMPILE="$NVCC -std=c++17 -O3 -x cu$pmla_gencode -Xcompiler -fPIC,-fvisibility=hidden -DPMLA_GPU_NVIDIA"
      GPU_CPPFLAGS="-DPMLA_GPU_NVIDIA -I$pmla_cuda_incdir"
      GPU_LIBS="-L$pmla_cuda_libdir -Wl,-rpath,$pmla_cuda_libdir -lcudart -lstdc++"
      AC_MSG_CHECKING([whether nvcc compiles for $pmla_arch_list])
      echo '__global__ void pmla_probe(int *p) { *p = 1; }' > conftest.hip
      AS_IF([$GPU_COMPILE -c conftest.hip -o conftest.$OBJEXT >&AS_MESSAGE_LOG_FD 2>&1],
            [AC_MSG_RESULT([yes])],
            [AC_MSG_RESULT([no]); AC_MSG_ERROR([nvcc cannot compile for $pmla_arch_list; see config.log])])
      rm -f conftest.hip conftest.$OBJEXT],
    [amd], [
      AS_IF([test -z "$HIPCC"], [AC_MSG_ERROR([--with-hip=amd needs hipcc (Debian: hipcc)])])
      AS_IF([test -z "$pmla_arch_list"], [pmla_arch_list="gfx90a gfx940"])
      pmla_offload=
      for a in $pmla_arch_list; do pmla_offload="$pmla_offload --offload-arch=$a"; done
      GPU_PLATFORM=amd
      GPU_COMPILE="$HIPCC -std=c++17 -O3$pmla_offload -fPIC -fvisibility=hidden -DPMLA_GPU_AMD"
      GPU_CPPFLAGS="-DPMLA_GPU_AMD -D__HIP_PLATFORM_AMD__"
      GPU_LIBS="-lamdhip64 -lstdc++"
      AC_MSG_CHECKING([whether hipcc compiles for $pmla_arch_list])
      echo '#include <hip/hip_runtime.h>
__global__ void pmla_probe(int *p) { *p = 1; }' > conftest.hip
      AS_IF([$GPU_COMPILE -c conftest.hip -o conftest.$OBJEXT >&AS_MESSAGE_LOG_FD 2>&1],
            [AC_MSG_RESULT([yes])],
            [AC_MSG_RESULT([no]); AC_MSG_ERROR([hipcc cannot compile for $pmla_arch_list; see config.log])])
      rm -f conftest.hip conftest.$OBJEXT])
  AS_IF([test "$GPU_PLATFORM" != none],
        [AC_DEFINE_UNQUOTED([PMLA_GPU_ARCHS], ["$pmla_arch_list"],
                            [the GPU targets the kernels are built for, named by init_builder's refusal of a device none of them runs on])])
  AC_MSG_CHECKING([GPU platform of the pmla backend])
  AC_MSG_RESULT([$GPU_PLATFORM${pmla_arch_list:+ ($pmla_arch_list)}])
  AC_SUBST([GPU_PLATFORM])
  AC_SUBST([GPU_COMPILE])
  AC_SUBST([GPU_CPPFLAGS])
  AC_SUBST([GPU_LIBS])
  AM_CONDITIONAL([PMLA_GPU], [test "$GPU_PLATFORM" != none])
  AM_CONDITIONAL([PMLA_GPU_NVIDIA], [test "$GPU_PLATFORM" = nvidia])
  AM_CONDITIONAL([PMLA_GPU_AMD], [test "$GPU_PLATFORM" = amd])
])
