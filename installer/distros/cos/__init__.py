"""Container-Optimized OS: prebuilt signed modules when the build has them, else a build
with the build's own kernel headers and cross toolchain.

Decisions are made when the plan is built (it may read the build's small
metadata files: version aliases, ``toolchain_url``, ``toolchain_env``, and
probe whether prebuilt modules exist); big artifacts are fetched by steps, in
parallel, only after the signature policy allowed it.

- **prebuilt** (``nvidia-drivers-<V>.tgz`` exists, preferred): its signed (open)
  modules go into ``drivers/`` and the NVIDIA installer runs for user space
  only (``--no-kernel-module``). Module source ``prebuilt``, open modules.
- **precompiled-signed** (signatures enforced, no usable prebuilt modules, and the
  build has ``extensions/gpu/NVIDIA-Linux-x86_64-<V>-custom.run`` and
  ``nvidia-drivers-<V>-signature.tar.gz``): as Google's installer, link
  ``nvidia.ko``/``nvidia-modeset.ko`` from NVIDIA's precompiled kernel interfaces
  with the toolchain's ``ld.lld -T module.lds``, append Google's PKCS#7
  signatures, user space with ``--no-kernel-module``. Proprietary modules
  (pre-Turing GPUs: P4, P100, V100, K80). Module source ``precompiled``.
- **compiled**: ``kernel-headers.tgz`` and the toolchain, cached on the host
  under the tools dir, then the shared nvidia-installer build with
  ``--kernel-source-path`` and the toolchain's CC/CXX/PATH. Module source
  ``compiled``. Refused with exit 10 before any big download if
  the kernel only loads signed modules.
- **cached**: same build, version and intact files: load and verify.
- **preload** (``--preload``): fetch and cache the toolchain and headers only.

On arm64 (board ``lakitu-arm64``) the artifacts are that board's and only **prebuilt**
and **cached** are offered; ``boards`` says why, from Google's source.
"""
