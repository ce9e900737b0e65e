"""The NVLink fabric steps of an install (docs/node-shapes.md): only where fabric.detect finds one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from installer.plan import Step

if TYPE_CHECKING:
    from installer.context import Context


def for_node(ctx: Context, version: str) -> tuple[Step, ...]:
    """The fabric manager's files for ``version`` on a node with an NVLink fabric (NVSwitch
    gen 2/3 or NVLink5: fabric.detect); nothing elsewhere (that plan is unchanged)."""
    if not ctx.node.fabric_present:
        return ()
    return (fabric_manager_files(version, ctx.arch.redist),)


def fabric_manager_files(version: str, platform: str = "linux-x86_64") -> Step:
    """``platform``: NVIDIA's redistributable platform of the node (linux-x86_64 or
    linux-sbsa: cpuarch.CpuArch.redist; the default is fabricmanager.PLATFORM)."""
    # The fabric manager's fetch (the network stack, the archive reader): only a node with
    # an NVLink fabric plans this step, so no other node's cache hit loads it.
    from installer.services.fabricmanager import archive_name, fetch_into

    def run(ctx: Context) -> None:
        s = ctx.settings
        fetch_into(ctx.install.root, version, session=ctx.http,
                                 base_url=s.fabric_manager_base_url,
                                 sha256=s.fabric_manager_sha256, platform=platform)

    return Step("fabric_manager", run, "NVLink fabric node: "
                f"{archive_name(version, platform)} "
                "into <install-dir>/fabricmanager (kept for later runs)")
