"""``nvidia-driver-installer manifests``: ``render`` (the DaemonSets) and ``bundle-job``.

Bad values are usage errors (exit 2) naming the flag. ``render --kind bundle-job`` (the
older spelling) still works: the group reads it as ``bundle-job``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from installer.base.branches import EXAMPLE_VERSION
from installer.base.kinds import MODULE_TYPE_REQUESTS
from installer.commands.manifests.bundle_job import JobOptions
from installer.commands.manifests.bundle_job import render as render_job
from installer.commands.manifests.render import (
    RenderOptions,
    image_ref,
    match_expressions,
    needs_nfd,
    render,
    render_files,
    render_pod_monitoring,
    sidecars,
)
from installer.commands.manifests.validate import (
    check_sidecars_supported,
    fill_flavor,
    parse_env,
    parse_image,
    parse_kube_version,
    validate_digest,
    validate_driver_sha256,
    validate_driver_version,
    validate_instance,
    validate_metrics_file,
    validate_namespace,
)
from installer.commands.manifests.values import (
    AFFINITY_MODES,
    DEFAULT_IMAGE_REPO,
    DEFAULT_NAMESPACE,
    DEFAULT_NODE_LABELS,
    DEFAULT_PAUSE_IMAGE,
    FLAVORS,
    OS_ID_LABEL,
    PARTITION_GPUS_FLAVORS,
    PARTITION_GPUS_IMAGE,
    PLACEHOLDER_REGISTRY,
    default_image,
    is_pinned,
    is_placeholder,
)
from installer.distros import BUNDLE_BUILDER, DISTROS

BUNDLE_JOB_FILE = "bundle-job.yaml"


class ManifestsGroup(click.Group):
    """Reads ``render --kind bundle-job …`` as ``bundle-job …`` and ``--kind daemonset``
    as plain ``render`` (the spelling before ``bundle-job`` was a command of its own)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args[:1] == ["render"]:
            rest, kind = _without_kind(args[1:])
            if kind not in (None, "daemonset", "bundle-job"):
                raise click.BadParameter(f"{kind!r} is not one of 'daemonset', 'bundle-job'",
                                         param_hint="--kind")
            args = ["bundle-job" if kind == "bundle-job" else "render", *rest]
        return super().parse_args(ctx, args)


def _without_kind(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without their ``--kind X`` / ``--kind=X``, and X (the last given)."""
    rest: list[str] = []
    kind = None
    items = iter(args)
    for arg in items:
        if arg == "--":
            rest += [arg, *items]
        elif arg == "--kind":
            kind = next(items, "")
        elif arg.startswith("--kind="):
            kind = arg.partition("=")[2]
        else:
            rest.append(arg)
    return rest, kind


@click.group("manifests", cls=ManifestsGroup)
def manifests() -> None:
    """Kubernetes manifests: the DaemonSets, the bundle build Job."""


def _output_dir_option(what: str) -> Callable[..., Any]:
    return click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
                        help=f"Write {what} here instead of stdout.")


def _env_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--env", "extra_env", metavar="KEY=VALUE", multiple=True,
                        help="Extra installer environment variable (repeatable), e.g. "
                        "FORCE_REINSTALL=1.")(fn)


def _bad(param: str, exc: ValueError) -> click.BadParameter:
    return click.BadParameter(str(exc), param_hint=param)


@manifests.command("render")
@click.option("--flavor", "flavors", type=click.Choice(FLAVORS), multiple=True,
              help="OS flavour to render (repeatable). Default: all, as with --all.")
@click.option("--all", "all_flavors", is_flag=True,
              help=f"Render every flavour ({', '.join(FLAVORS)}).")
@click.option("--image", metavar="REF",
              help="Installer image with a tag; '{flavor}' is replaced by the flavour's image "
              f"(debian: ubuntu). Default: {DEFAULT_IMAGE_REPO}:<package version>.")
@click.option("--image-digest", "image_digests", metavar="[FLAVOR=]sha256:HEX", multiple=True,
              help="Pin the image as REF@DIGEST. With several flavours, give FLAVOR=DIGEST each.")
@click.option("--pause-image", metavar="REF", default=DEFAULT_PAUSE_IMAGE, show_default=True,
              help="Main (pause) container image.")
@click.option("--driver-version", metavar="V",
              help="NVIDIA_DRIVER_VERSION. Default: "
              + ", ".join(f"{d.default_version} on {d.title}" for d in DISTROS) + ".")
@click.option("--namespace", metavar="NAME", default=DEFAULT_NAMESPACE, show_default=True)
@click.option("--partition-gpus", is_flag=True,
              help="Run GKE's partition-gpus init container after the install, as GKE's COS "
              "DaemonSets do (COS only): MIG node pools (gpu-partition-size) get their "
              "partitions; a no-op elsewhere.")
@click.option("--nvswitch", is_flag=True,
              help="NVLink fabric node pools (HGX A100/H100/H200/B200): add NVIDIA's fabric "
              "manager as a native sidecar; the install is ready only once the fabric is "
              "trained (docs/node-shapes.md).")
@click.option("--fabric-manager-config", metavar="CONFIGMAP",
              help="With --nvswitch: a ConfigMap whose fabricmanager.cfg the fabric manager "
              "uses [default: NVIDIA's, in the foreground, logging to stderr]. The fabric "
              "manager runs as root with the host's /dev: whoever may edit this ConfigMap "
              "chooses what it writes, so the sidecar refuses a file path outside the "
              "install dir; guard the ConfigMap as you guard the DaemonSet.")
@click.option("--persistenced", is_flag=True,
              help="Add nvidia-persistenced as a native sidecar (NVIDIA's replacement for "
              "`nvidia-smi -pm 1`, which the 580 driver calls deprecated).")
@click.option("--health", is_flag=True,
              help="Add the GPU health sidecar (`sidecar health`): Xid events, GPUs gone, "
              "daemons down; /metrics for Prometheus and /healthz as its readiness "
              "(docs/health-and-metrics.md).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=9402,
              show_default=True, help="With --health: the port of /metrics and /healthz.")
@click.option("--pod-monitoring", is_flag=True,
              help="With --health: add a GKE Managed Prometheus PodMonitoring that scrapes "
              "the sidecars' /metrics (podmonitoring.yaml with --output-dir).")
@click.option("--partition-gpus-image", metavar="REF", default=PARTITION_GPUS_IMAGE,
              show_default=True, help="The partition-gpus image (a mirror of GKE's, pinned "
              "by digest) with --partition-gpus.")
@click.option("--driver-sha256", metavar="HEX", help="NVIDIA_DRIVER_SHA256: the SHA-256 of "
              "the --driver-version .run; a .run that differs is refused (exit 6).")
@click.option("--metrics-file", metavar="HOST_PATH",
              help="NVIDIA_INSTALLER_METRICS_FILE: a *.prom file in node_exporter's textfile "
              "collector dir on the host, e.g. "
              "/var/lib/node_exporter/textfile_collector/nvidia_driver_installer.prom "
              "[default: no metrics].")
@click.option("--name", "instance", metavar="NAME",
              help="Instance name, for one DaemonSet per node pool: nvidia-driver-installer-"
              "<flavor>-NAME, its own instance label and selector, daemonset-<flavor>-NAME.yaml "
              "(e.g. the pool's name, with --affinity label --node-label "
              "cloud.google.com/gke-nodepool=NAME).")
@click.option("--affinity", type=click.Choice(AFFINITY_MODES), default="gke", show_default=True,
              help="gke: GKE GPU nodes whose driver GKE does not manage; "
              "label: nodes with the --node-label labels (and the flavor's OS, "
              "feature.node.kubernetes.io/system-os_release.ID, unless the labels name it); "
              "none: no node affinity (one --flavor only).")
@click.option("--node-label", "node_labels", metavar="KEY[=VALUE]", multiple=True,
              help="Node label required with --affinity label (repeatable; '{flavor}' is "
              "replaced). Default: " + ", ".join(DEFAULT_NODE_LABELS) + ".")
@click.option("--kube-version", metavar="VERSION",
              help="The cluster's Kubernetes version (`kubectl version`'s Server Version): a "
              "render with native sidecars is refused below 1.29. Default: not checked.")
@_env_option
@_output_dir_option("daemonset-<flavor>.yaml and kustomization.yaml")
def render_command(flavors: tuple[str, ...], all_flavors: bool, image_digests: tuple[str, ...],
                   node_labels: tuple[str, ...], extra_env: tuple[str, ...],
                   output_dir: Path | None, **given: Any) -> None:
    """Render the installer DaemonSet(s) as YAML (the bundle build Job: ``bundle-job``)."""
    if all_flavors and flavors:
        raise click.UsageError("give --flavor or --all, not both")
    kube_version = given.pop("kube_version", None)
    try:
        kube = parse_kube_version(kube_version) if kube_version is not None else None
    except ValueError as exc:
        raise _bad("--kube-version", exc) from None
    selected = tuple(dict.fromkeys(flavors)) if flavors else FLAVORS
    try:
        env = parse_env(extra_env)
    except ValueError as exc:
        raise _bad("--env", exc) from None
    _check_combinations(selected, node_labels, env, **given)
    opts = RenderOptions(image_digests=_parse_digests(image_digests, selected),
                         node_labels=node_labels or DEFAULT_NODE_LABELS, extra_env=env, **given)
    _check_each_option(selected, opts)
    _warn_unpinned(selected, opts)
    if nfd := [f for f in selected if needs_nfd(f, opts)]:
        click.echo(f"warning: --affinity label: the {', '.join(nfd)} DaemonSet(s) also require "
                   f"Node Feature Discovery's {OS_ID_LABEL} label (the --node-label labels do "
                   "not tell the flavours apart): without NFD no node has it and no pod runs. "
                   "Add a label naming the flavour (e.g. example.com/os={flavor}); with a "
                   "cloud.google.com/ label (GKE) GKE's own OS label is used instead, for the "
                   "flavours GKE has node images of", err=True)
    rendered = "".join(render(f, opts) for f in selected)
    if kube is not None:
        try:
            check_sidecars_supported(kube, rendered)
        except ValueError as exc:
            raise _bad("--kube-version", exc) from None
    if output_dir is None:
        monitoring = render_pod_monitoring(selected, opts) if opts.pod_monitoring else ""
        click.echo(rendered + monitoring, nl=False)
    else:
        _write(output_dir, render_files(selected, opts))


def _check_combinations(selected: Sequence[str], node_labels: Sequence[str],
                        extra_env: Mapping[str, str], *, image: str | None, affinity: str,
                        partition_gpus: bool, driver_sha256: str | None,
                        metrics_file: str | None, health: bool, metrics_port: int,
                        pod_monitoring: bool, **_: Any) -> None:
    """Options that make no sense together (each alone is checked with the flavours)."""
    if pod_monitoring and not health:
        raise click.UsageError("--pod-monitoring scrapes the health sidecar: add --health")
    if metrics_port != RenderOptions.metrics_port and not health:
        raise click.UsageError("--metrics-port is the health sidecar's: add --health")
    for flag, value, var in (("--driver-sha256", driver_sha256, "NVIDIA_DRIVER_SHA256"),
                             ("--metrics-file", metrics_file, "NVIDIA_INSTALLER_METRICS_FILE")):
        if value and var in extra_env:
            raise click.UsageError(f"{flag} and --env {var} both set it: give one")
    if partition_gpus and not set(selected) & set(PARTITION_GPUS_FLAVORS):
        raise click.UsageError("--partition-gpus: GKE runs partition-gpus only in its "
                               f"{'/'.join(PARTITION_GPUS_FLAVORS)} DaemonSets; render that flavor")
    if node_labels and affinity != "label":
        raise click.UsageError("--node-label only applies with --affinity label")
    if affinity == "none" and len(selected) > 1:
        raise click.UsageError("--affinity none puts every flavor on every node: render one "
                               "--flavor, or use --affinity gke or label")
    if image:
        try:
            fill_flavor(image, "x", what="image")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--image") from None
    if image and len(selected) > 1 and "{flavor}" not in image:
        raise click.BadParameter(
            "each flavor has its own image: include '{flavor}' in REF or render one --flavor",
            param_hint="--image")


def _check_each_option(selected: Sequence[str], opts: RenderOptions) -> None:
    """Each option on its own, before rendering, so the error names the flag."""
    checks: list[tuple[str, Callable[[], object]]] = [
        ("--namespace", lambda: validate_namespace(opts.namespace)),
        ("--pause-image",
         lambda: parse_image(opts.pause_image, what="pause image", require_tag=False)),
        ("--fabric-manager-config", lambda: sidecars(opts)),
        ("--partition-gpus-image", lambda: parse_image(
            opts.partition_gpus_image, what="partition-gpus image", require_tag=False)),
    ]
    if (sha256 := opts.driver_sha256):
        checks.append(("--driver-sha256",
                       lambda: validate_driver_sha256(sha256, opts.driver_version)))
    if (metrics_file := opts.metrics_file):
        checks.append(("--metrics-file", lambda: validate_metrics_file(metrics_file)))
    for f in selected:
        checks.append(("--image", functools.partial(image_ref, f, opts)))
        if (instance := opts.instance) is not None:
            checks.append(("--name", functools.partial(validate_instance, f, instance)))
        if (version := opts.driver_version):
            checks.append(("--driver-version",
                           functools.partial(validate_driver_version, f, version)))
        checks.append(("--node-label", functools.partial(match_expressions, f, opts)))
    for param, check in checks:
        try:
            check()
        except ValueError as exc:
            raise _bad(param, exc) from None


def _warn_unpinned(selected: Sequence[str], opts: RenderOptions) -> None:
    """Every image the manifests name, pinned by digest or warned about (and a placeholder
    said to be one)."""
    if any(is_placeholder(image_ref(f, opts)) for f in selected):
        warn_placeholder()
    for f in selected:
        if f not in opts.image_digests and not is_placeholder(image_ref(f, opts)):
            click.echo(f"warning: the {f} image is pinned by tag only ({image_ref(f, opts)}): a "
                       "re-pushed tag changes what every GPU node runs as root; pin it with "
                       f"--image-digest {f}=sha256:<digest of the pushed image>",
                       err=True)
    warn_tag_only("pause", opts.pause_image, "--pause-image REF@sha256:<digest>")
    if opts.partition_gpus and set(selected) & set(PARTITION_GPUS_FLAVORS):
        warn_tag_only("partition-gpus", opts.partition_gpus_image,
                      "--partition-gpus-image REF@sha256:<digest>")


def warn_placeholder() -> None:
    click.echo(f"warning: no --image: the manifests name the placeholder registry "
               f"{PLACEHOLDER_REGISTRY}; no image of this project is published. Build and "
               "push your own (make images; make push REGISTRY=...) and render with the "
               "command make push prints", err=True)


def warn_tag_only(what: str, ref: str, how: str) -> None:
    if not is_pinned(ref):
        click.echo(f"warning: the {what} image is pinned by tag only ({ref}): a re-pushed tag "
                   f"changes what runs on every GPU node; pin it with {how}", err=True)


def _parse_digests(items: Sequence[str], flavors: Sequence[str]) -> dict[str, str]:
    digests: dict[str, str] = {}
    for item in items:
        flavor, sep, digest = item.rpartition("=")
        try:
            validate_digest(digest)
        except ValueError as exc:
            raise _bad("--image-digest", exc) from None
        if sep and flavor not in flavors:
            raise click.BadParameter(
                f"{flavor!r} is not one of the flavors rendered ({', '.join(flavors)})",
                param_hint="--image-digest")
        if not sep and len(flavors) > 1:
            raise click.BadParameter(
                "each flavor has its own image: give FLAVOR=sha256:... per flavor",
                param_hint="--image-digest")
        for f in [flavor] if sep else flavors:
            if f in digests:
                raise click.BadParameter(f"digest for {f} given twice", param_hint="--image-digest")
            digests[f] = digest
    return digests


@manifests.command("bundle-job")
@click.option("--target", "targets", metavar="DRIVER@KERNEL", multiple=True,
              help=f"One bundle to build (repeatable), e.g. {EXAMPLE_VERSION}@6.8.0-1015-gke.")
@click.option("--kernel-module-type", "module_type",
              type=click.Choice(MODULE_TYPE_REQUESTS), default="auto",
              show_default=True, help="Module type built; auto: NVIDIA's default for each "
              "target's branch (open from R560), as a node with Turing or newer GPUs picks it, "
              "so its bundles are the ones those nodes look for.")
@click.option("--parallelism", type=int, default=4, show_default=True,
              help="Pods building at once.")
@click.option("--volume-claim", metavar="PVC", help="Keep bundles and index.json in this "
              "PersistentVolumeClaim [default: an emptyDir, for an uploader].")
@click.option("--uploader-image", metavar="REF",
              help="Image of the upload hook (with gsutil, oras or curl).")
@click.option("--upload-command", metavar="SH",
              help="Shell command uploading $BUNDLE_DIR/* (the bundle, its .sha256, index.json).")
@click.option("--image", metavar="REF", help="Installer image with a tag, pinned with "
              "@sha256:<digest>. Default: "
              f"{DEFAULT_IMAGE_REPO.format(flavor=BUNDLE_BUILDER.image())}:<package version>.")
@click.option("--namespace", metavar="NAME", default=DEFAULT_NAMESPACE, show_default=True)
@_env_option
@_output_dir_option(BUNDLE_JOB_FILE)
def bundle_job_command(image: str | None, extra_env: tuple[str, ...], output_dir: Path | None,
                       **job: Any) -> None:
    """Render the Job that builds precompiled driver bundles, one pod per --target."""
    try:
        opts = JobOptions(image=image or default_image(BUNDLE_BUILDER.image()),
                          extra_env=parse_env(extra_env), **job)
        text = render_job(opts)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if is_placeholder(opts.image):
        warn_placeholder()
    else:
        warn_tag_only("installer", opts.image, "--image REF@sha256:<digest>")
    if opts.uploader_image:
        warn_tag_only("uploader", opts.uploader_image, "--uploader-image REF@sha256:<digest>")
    if output_dir is None:
        click.echo(text, nl=False)
    else:
        _write(output_dir, {BUNDLE_JOB_FILE: text})


def _write(output_dir: Path, files: Mapping[str, str]) -> None:
    """Each file whole or not at all (written aside, then renamed)."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = output_dir / name
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            click.echo(f"wrote {path}", err=True)
    except OSError as exc:  # a path of this machine's, not the node's: say which and why
        raise click.BadParameter(f"cannot write the manifests to {output_dir}: "
                                 f"{exc.strerror or exc}", param_hint="--output-dir") from None
