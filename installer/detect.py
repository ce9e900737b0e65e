"""The ``detect`` command: what the installer sees on this node, without changing it."""

from __future__ import annotations

from installer import distros, gpus, signing
from installer.context import Context
from installer.modules import loaded_driver_version
from installer.settings import Settings


def run(settings: Settings) -> dict[str, object]:
    ctx = Context.from_settings(settings)
    info = ctx.host_info
    host = {k: v for k, v in info.to_dict().items() if k != "family"}  # "flow" says it
    return {
        **host,
        "flow": info.family,
        "support": distros.support(info),
        "install_dir": str(ctx.install.root),
        "signatures_enforced": signing.policy(ctx.kernel).enforced,
        # kernel.modules_disabled=1: nothing loads or unloads until reboot; False without
        # CONFIG_MODULE_UNLOAD ("- -" in /proc/modules): a loaded driver stays until reboot.
        "modules_disabled": ctx.kernel.modules_disabled(),
        "module_unload": ctx.kernel.can_unload(),
        "loaded_driver_version": loaded_driver_version(ctx.kernel),
        "gpus": [g.to_dict() for g in gpus.scan(ctx.kernel.sys_dir)],
    }
