"""A fleet's prebuilt driver bundles, as an install fetches them (built once per driver, kernel
and module type; installed on every node without compiling).

- ``fetch``: template -> URL, download with a pinned digest, safe extraction, checks,
  a staged install the usual load / verify / promote steps take over;
- ``index`` and ``tree``: the ``index.json`` beside the bundles, the archive's tree.

The ``bundle`` command and the build are in commands (``bundle_cli``, ``bundle_build``),
the manifest in records (``bundle_manifest``).
"""
