"""Precompiled driver bundles: build once per (driver, kernel, module type),
install on every node of a fleet without compiling.

- ``manifest``: the bundle's manifest and name, parsed and checked as hostile input;
- ``index``: the ``index.json`` beside the bundles (name -> sha256 and summary);
- ``build``: a built staging tree -> one archive, its ``.sha256`` (``bundle build``);
- ``fetch``: template -> URL, download with a pinned digest, safe extraction, checks,
  a staged install the usual load / verify / promote steps take over;
- ``cli``: the ``bundle`` command group.
"""
