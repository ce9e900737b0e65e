"""``manifests bundle-job``: a Kubernetes Job that builds a fleet's bundles.

An Indexed Job, one pod per ``DRIVER@KERNEL`` target: Kubernetes schedules,
retries and parallelises; each pod runs ``bundle build`` for its target (the
pod's ``JOB_COMPLETION_INDEX`` picks it) into a volume, then ``bundle index``
of that volume. With a PersistentVolumeClaim the bundles and one index stay
there (serve it, or copy it out); with an uploader image a user command
uploads the pod's bundle and its ``.sha256`` (``gsutil``, ``oras``, ``curl``:
the hook), and publishing is running ``bundle index`` where they land: nodes
install only indexed bundles. Validation raises ValueError naming the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field

from installer import __version__
from installer.base.dataclass import dataclass
from installer.commands.manifests.render import environment
from installer.commands.manifests.validate import DNS_SUBDOMAIN, parse_image, validate_namespace
from installer.commands.manifests.values import label_version
from installer.host.gpus import choose_module_type
from installer.records.bundle_manifest import BundleError, BundleKey

JOB_TEMPLATE = "bundle-job.yaml.j2"
JOB_NAME = "nvidia-driver-bundles"
# Built against the container's own root: headers found there or apt-get installed.
BUILD_ROOT = "/"


@dataclass(frozen=True)
class JobOptions:
    targets: Sequence[str]  # DRIVER@KERNEL
    image: str
    namespace: str
    module_type: str = "auto"  # auto: per target, as `bundle build` and the nodes resolve it
    parallelism: int = 4
    volume_claim: str | None = None
    uploader_image: str | None = None
    upload_command: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)


def built_module_type(version: str, requested: str) -> str:
    """The module type `bundle build` makes for ``version`` (no GPU to look at: ``auto`` is
    NVIDIA's default for the branch, what a node with Turing or newer GPUs asks for)."""
    return choose_module_type([], version, requested).module_type


def check_targets(targets: Sequence[str], module_type: str) -> list[str]:
    if not targets:
        raise ValueError("give at least one --target DRIVER@KERNEL")
    keys = []
    for item in targets:
        version, at, release = item.partition("@")
        try:
            if not at:
                raise BundleError("it is not DRIVER@KERNEL")
            keys.append(BundleKey.of(version, release, built_module_type(version, module_type)).name())
        except BundleError as exc:
            raise ValueError(f"--target {item!r}: {exc}") from None
    if len(set(keys)) != len(keys):
        raise ValueError("a --target is given twice")
    return list(targets)


def context(opts: JobOptions) -> dict[str, object]:
    targets = check_targets(opts.targets, opts.module_type)
    parse_image(opts.image, require_tag=False)  # a digest pins it (REF:TAG@sha256:...)
    validate_namespace(opts.namespace)
    if opts.parallelism < 1:
        raise ValueError("--parallelism must be at least 1")
    if opts.volume_claim is not None and not DNS_SUBDOMAIN.match(opts.volume_claim):
        raise ValueError(f"--volume-claim {opts.volume_claim!r} is not a DNS subdomain name")
    if (opts.uploader_image is None) != (opts.upload_command is None):
        raise ValueError("--uploader-image and --upload-command go together")
    if opts.uploader_image is None and opts.volume_claim is None:
        raise ValueError("give --volume-claim (bundles and index.json stay there) or "
                         "--uploader-image and --upload-command (each pod uploads its bundle)")
    if opts.uploader_image is not None:
        parse_image(opts.uploader_image, what="uploader image", require_tag=False)
    env = {"ROOT_MOUNT_DIR": BUILD_ROOT, "NVIDIA_BUNDLE_TARGETS": " ".join(targets),
           "NVIDIA_KERNEL_MODULE_TYPE": opts.module_type, "LOG_FORMAT": "json",
           **opts.extra_env}
    return {
        "name": JOB_NAME, "namespace": opts.namespace, "version": __version__,
        "labels": {"app.kubernetes.io/name": JOB_NAME,
                   "app.kubernetes.io/part-of": "nvidia-driver-installer",
                   "app.kubernetes.io/version": label_version()},
        "image": opts.image, "targets": targets,
        "parallelism": min(opts.parallelism, len(targets)),
        "env": list(env.items()), "volume_claim": opts.volume_claim,
        "uploader_image": opts.uploader_image, "upload_command": opts.upload_command,
    }


def render(opts: JobOptions) -> str:
    return environment().get_template(JOB_TEMPLATE).render(**context(opts))

