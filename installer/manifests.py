"""DaemonSet manifests: rendered from jinja2 templates shipped in the package.

``nvidia-driver-installer manifests render`` writes one DaemonSet per distro
(``daemonset-<flavor>.yaml``, from what each class in ``distros/`` declares) following
the pod contract of DESIGN.md section 2. The defaults are committed under ``manifests/`` and a
test fails when they drift from a fresh render (``make manifests`` fixes it).

Everything a user can pass is validated here, before any template is touched,
so a bad value is a usage error (exit 2) and never a manifest the API server
or the installer would reject later. jinja2 is imported lazily: the CLI's
``--help`` must not pay for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from installer import __version__
from installer.distros import DISTROS
from installer.distros.daemonset import HostMount
from installer.settings import ENV_RETRIES, ENV_TIMEOUT  # env only: no CLI option names them


def _installer_env_vars() -> tuple[str, ...]:
    """Every environment variable the installer reads (DESIGN.md section 3), derived from
    the CLI's options so the two cannot drift; the manifests may only set these (plus the
    proxy and CA variables below)."""
    from installer.cli import env_vars

    return (*env_vars(), ENV_RETRIES, ENV_TIMEOUT)


INSTALLER_ENV_VARS: tuple[str, ...] = _installer_env_vars()

# Read by ``requests`` rather than by our options (DESIGN.md section 3:
# downloads honour proxies and REQUESTS_CA_BUNDLE / SSL_CERT_FILE).
PASSTHROUGH_ENV_VARS: tuple[str, ...] = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
)

# One DaemonSet flavour per distro class, with what the class declares about itself.
FLAVORS: tuple[str, ...] = tuple(d.name for d in DISTROS)
FLAVOR_TITLES = {d.name: d.title for d in DISTROS}
DISTROS_BY_FLAVOR = {d.name: d for d in DISTROS}
# The images those DaemonSets run (images/<flavor>/Dockerfile): Debian's runs Ubuntu's.
IMAGE_FLAVORS: tuple[str, ...] = tuple(dict.fromkeys(d.image() for d in DISTROS))

# The pod contract (DESIGN.md section 2). Fixed: the mounts and these env
# values must agree, so ``--env`` cannot change them. Each distro adds its own
# (Distro.daemonset).
HOST_ROOT_CONTAINER = "/root"
INSTALL_DIR_HOST = "/home/kubernetes/bin/nvidia"
INSTALL_DIR_CONTAINER = "/usr/local/nvidia"
CONTRACT_ENV: dict[str, str] = {
    "ROOT_MOUNT_DIR": HOST_ROOT_CONTAINER,
    "NVIDIA_INSTALL_DIR_HOST": INSTALL_DIR_HOST,
    "NVIDIA_INSTALL_DIR_CONTAINER": INSTALL_DIR_CONTAINER,
}
CONTRACT_MOUNTS: tuple[HostMount, ...] = (
    HostMount("root-mount", "/", HOST_ROOT_CONTAINER, "Directory",
              "The whole host root: os-release, kernel headers, ld.so.conf, lock."),
    HostMount("dev", "/dev", "/dev", "Directory"),
    HostMount("nvidia-install-dir-host", INSTALL_DIR_HOST, INSTALL_DIR_CONTAINER,
              "DirectoryOrCreate", f"Workloads mount {INSTALL_DIR_HOST}/{{bin,lib64}} later."),
)
# Env a distro's DaemonSet fixes (its mounts' paths): no --env may set them.
FIXED_ENV: frozenset[str] = frozenset(CONTRACT_ENV).union(
    *({k for k, _ in d.daemonset.env} for d in DISTROS))
# Env only some distros read: set on their DaemonSets only.
OWN_ENV: frozenset[str] = frozenset().union(*(d.daemonset.own_env for d in DISTROS))

DEFAULT_DRIVER_VERSION = {d.name: d.default_version for d in DISTROS}
DEFAULT_IMAGE_REPO = "ghcr.io/nvidia-driver-installer/nvidia-driver-installer-{flavor}"
DEFAULT_PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_LOG_FORMAT = "json"
# Wait up to 10 minutes for another installer (GKE's own, or a previous pod
# still finishing) instead of failing at once and crash-looping.
DEFAULT_LOCK_TIMEOUT = "600"
# A different driver in use: stage the new one for the next boot and let the pod run,
# instead of exit 8 and a crash-looping init container (the CLI's default is fail).
DEFAULT_WHEN_IN_USE = "stage"
AFFINITY_MODES: tuple[str, ...] = ("gke", "label", "none")
# Set by NVIDIA's GPU feature discovery / the GPU operator's NFD rule: present on GPU
# nodes of most non-GKE clusters.
DEFAULT_NODE_LABELS: tuple[str, ...] = ("nvidia.com/gpu.present=true",)
# Node Feature Discovery's "system" source: the node's os-release ID. Where the labels do
# not tell the flavours apart, each DaemonSet requires its distro's os_ids here (every OS
# its flow serves, not the flavour's name), so no two land on one node.
OS_ID_LABEL = "feature.node.kubernetes.io/system-os_release.ID"
GKE_OS_LABEL = "cloud.google.com/gke-os-distribution"
# Values of GKE's cloud.google.com/gke-os-distribution label per flavour.
GKE_OS_DISTRIBUTIONS = {d.name: d.gke_os_distributions for d in DISTROS}

TEMPLATE_PACKAGE = "installer"
TEMPLATE_DIR = "templates"
DAEMONSET_TEMPLATE = "daemonset.yaml.j2"
KUSTOMIZATION_TEMPLATE = "kustomization.yaml.j2"


def daemonset_name(flavor: str, instance: str | None = None) -> str:
    """``nvidia-driver-installer-<flavor>``, or ``…-<flavor>-<instance>`` for one DaemonSet
    per node pool (``--name``): its own metadata.name, instance label and selector."""
    return f"nvidia-driver-installer-{flavor}" + (f"-{instance}" if instance else "")


def daemonset_filename(flavor: str, instance: str | None = None) -> str:
    return f"daemonset-{flavor}" + (f"-{instance}" if instance else "") + ".yaml"


# --- validation (pure; raises ValueError with a one-line reason) -------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
# A container image reference, as the distribution "reference" grammar has it.
_REF_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# A registry host: "localhost", a dotted name or any name with a port.
_REF_DOMAIN = (
    r"(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?|[A-Za-z0-9-]+:[0-9]+)"
)
_IMAGE_REF = re.compile(
    rf"^(?:{_REF_DOMAIN}/)?{_REF_COMPONENT}(?:/{_REF_COMPONENT})*"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)


def _check_len(value: str, limit: int, what: str) -> None:
    if len(value) > limit:
        raise ValueError(f"{what} {value!r} is longer than {limit} characters")


def validate_namespace(value: str) -> str:
    _check_len(value, 63, "namespace")
    if not _DNS_LABEL.match(value):
        raise ValueError(f"namespace {value!r} is not a DNS-1123 label (lower case, digits, '-')")
    return value


def validate_instance(flavor: str, value: str) -> str:
    """``--name``: a DNS-1123 label short enough that the DaemonSet's name, which is also its
    ``app.kubernetes.io/instance`` label value, stays within 63 characters."""
    if not _DNS_LABEL.match(value):
        raise ValueError(f"{value!r} is not a DNS-1123 label (lower case, digits, '-'), e.g. "
                         "the node pool's name")
    _check_len(daemonset_name(flavor, value), 63, "the DaemonSet name")
    return value


def validate_label_key(key: str) -> str:
    prefix, sep, name = key.rpartition("/")
    if sep:
        _check_len(prefix, 253, "label key prefix")
        if not _DNS_SUBDOMAIN.match(prefix):
            raise ValueError(f"label key prefix {prefix!r} is not a DNS subdomain")
    _check_len(name, 63, "label name")
    if not _LABEL_NAME.match(name):
        raise ValueError(f"label name {name!r} is not a valid Kubernetes label name")
    return key


def validate_label_value(value: str) -> str:
    _check_len(value, 63, "label value")
    if value and not _LABEL_NAME.match(value):
        raise ValueError(f"label value {value!r} is not a valid Kubernetes label value")
    return value


def parse_image(ref: str, *, what: str = "image", require_tag: bool = True) -> str:
    m = _IMAGE_REF.match(ref)
    if not m:
        raise ValueError(f"{what} {ref!r} is not a valid image reference")
    if require_tag:
        if m.group("digest"):
            raise ValueError(
                f"{what} {ref!r}: give the tag here and the digest with --image-digest"
            )
        if not m.group("tag"):
            raise ValueError(f"{what} {ref!r} has no tag (pin it, e.g. ':{image_tag()}')")
    elif not (m.group("tag") or m.group("digest")):
        raise ValueError(f"{what} {ref!r} has neither a tag nor a digest")
    return ref


def validate_digest(value: str) -> str:
    if not _DIGEST.match(value):
        raise ValueError(f"digest {value!r} is not 'sha256:' followed by 64 lower-case hex digits")
    return value


def validate_driver_version(flavor: str, value: str) -> str:
    from installer.nvidia_options import too_old

    if (why := too_old(value)) is not None:  # the rule install applies
        raise ValueError(why)
    return DISTROS_BY_FLAVOR[flavor].check_version_request(value)


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings -> an ordered mapping; refuses names the installer
    does not read and the names fixed by the pod contract."""
    env: dict[str, str] = {}
    allowed = set(INSTALLER_ENV_VARS) | set(PASSTHROUGH_ENV_VARS)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        if key in FIXED_ENV:
            raise ValueError(
                f"{key} is fixed by the pod contract (it must match the volume mounts)"
            )
        if key == "NVIDIA_DRIVER_VERSION":
            raise ValueError("set NVIDIA_DRIVER_VERSION with --driver-version")
        if key not in allowed:
            raise ValueError(
                f"{key} is not read by the installer; known: " + ", ".join(sorted(allowed))
            )
        if key in env:
            raise ValueError(f"{key} is given twice")
        if key == "LOG_FORMAT" and value not in ("auto", "json", "console"):
            raise ValueError(f"LOG_FORMAT={value!r}: expected auto, json or console")
        if key == "LOCK_TIMEOUT" and not value.isdigit():
            raise ValueError(f"LOCK_TIMEOUT={value!r}: expected a whole number of seconds")
        env[key] = value
    return env


def parse_node_label(item: str, flavor: str) -> tuple[str, str | None]:
    """``key=value`` (or bare ``key``: label must exist) with ``{flavor}`` filled in."""
    key, sep, value = item.partition("=")
    key = key.replace("{flavor}", flavor)
    validate_label_key(key)
    if not sep:
        return key, None
    value = value.replace("{flavor}", flavor)
    validate_label_value(value)
    return key, value


def image_tag() -> str:
    # Image tags allow [A-Za-z0-9_.-]: a local version ("0.1.0+g1234") becomes "0.1.0-g1234".
    return re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)


def label_version() -> str:
    v = re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)[:63]
    return v.strip("-_.") or "unknown"


def default_image(flavor: str) -> str:
    return f"{DEFAULT_IMAGE_REPO.format(flavor=flavor)}:{image_tag()}"


# --- rendering ----------------------------------------------------------------

_PLAIN_SCALAR = re.compile(r"^[A-Za-z/][A-Za-z0-9._/@+-]*(?::[A-Za-z0-9._/@+-]+)*$")
_YAML11_SPECIAL = re.compile(r"^(?:y|yes|n|no|true|false|on|off|null|~)$", re.IGNORECASE)


def yaml_str(value: Any) -> str:
    """A YAML string scalar: plain when that is unambiguous, else double-quoted.

    JSON string syntax is a subset of YAML's double-quoted style, so any text
    (newlines, quotes, non-ASCII) round-trips.
    """
    s = str(value)
    if _PLAIN_SCALAR.match(s) and not _YAML11_SPECIAL.match(s):
        return s
    return json.dumps(s)


def yaml_quoted(value: Any) -> str:
    """Always double-quoted (env values and label values: always strings)."""
    return json.dumps(str(value))


@dataclass(frozen=True)
class RenderOptions:
    """What ``manifests render`` was asked for, already validated per flavour."""

    image: str | None = None  # may hold "{flavor}"
    image_digests: Mapping[str, str] = field(default_factory=dict)  # flavor -> digest
    pause_image: str = DEFAULT_PAUSE_IMAGE
    driver_version: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    affinity: str = "gke"
    node_labels: Sequence[str] = DEFAULT_NODE_LABELS
    extra_env: Mapping[str, str] = field(default_factory=dict)
    instance: str | None = None  # --name: one DaemonSet per node pool
    partition_gpus: bool = False  # GKE's MIG partitioner after the install (COS, as GKE)


def _match_expressions(flavor: str, opts: RenderOptions) -> list[dict[str, Any]]:
    """The flavour's node affinity. The COS and the Ubuntu DaemonSet must never land on the
    same node: with --affinity label, when the labels do not tell the flavours apart, the
    other flavour's own label keys must be absent (``example.com/os-{flavor}``), else the
    node's OS must be this flavour (NFD's os_release.ID)."""
    exprs = _flavor_expressions(flavor, opts)
    for other in FLAVORS:
        theirs = _flavor_expressions(other, opts)
        if other == flavor or opts.affinity != "label" or _disjoint(exprs, theirs):
            continue
        ours = {e["key"] for e in exprs}
        only_theirs = [e["key"] for e in theirs if e["key"] not in ours]
        if only_theirs:
            exprs += [{"key": k, "operator": "DoesNotExist"} for k in only_theirs]
        elif OS_ID_LABEL not in ours:
            exprs.append(_os_id_expression(flavor))
    return exprs


def _os_id_expression(flavor: str) -> dict[str, Any]:
    return {"key": OS_ID_LABEL, "operator": "In", "values": list(DISTROS_BY_FLAVOR[flavor].os_ids)}


def _gke_os_expressions(flavor: str) -> list[dict[str, Any]]:
    """GKE's OS label. A distro GKE has no node image of (``In []`` is invalid, and leaving
    the OS out would land on every GKE GPU node): no GKE OS label, and the node's
    os-release ID."""
    values = GKE_OS_DISTRIBUTIONS[flavor]
    if not values:
        return [{"key": GKE_OS_LABEL, "operator": "DoesNotExist"}, _os_id_expression(flavor)]
    return [{"key": GKE_OS_LABEL, "operator": "In", "values": list(values)}]


# GKE's MIG partitioner (partition_gpu/partition_gpu.go: a no-op without
# /etc/nvidia/gpu_config.json), in the DaemonSets of the distros GKE runs it for
# (DaemonSetNeeds.partition_gpus: COS).
PARTITION_GPUS_IMAGE = ("gcr.io/gke-release/nvidia-partition-gpu@sha256:"
                        "c54fd003948fac687c2a93a55ea6e4d47ffbd641278a9191e75e822fe72471c2")
PARTITION_GPUS_FLAVORS = tuple(d.name for d in DISTROS if d.daemonset.partition_gpus)
# Nodes never ours, whatever selects them: nodes whose driver GKE installs itself
# (gpu-driver-version set at node-pool creation) are left to GKE, as GKE's own manifests
# do; confidential GPU nodes (TDX, SEV) need GKE's own confidential DaemonSet.
GKE_GUARDS: tuple[dict[str, Any], ...] = (
    {"key": "cloud.google.com/gke-gpu-driver-version", "operator": "DoesNotExist"},
    {"key": "cloud.google.com/gke-confidential-nodes-instance-type", "operator": "DoesNotExist"},
)


def _partition_gpus_image(flavor: str, opts: RenderOptions) -> str:
    """GKE's partition-gpus image where GKE runs it (its COS DaemonSets), else ""."""
    return PARTITION_GPUS_IMAGE if opts.partition_gpus and flavor in PARTITION_GPUS_FLAVORS else ""


def _flavor_expressions(flavor: str, opts: RenderOptions) -> list[dict[str, Any]]:
    if opts.affinity == "none":
        return []
    if opts.affinity == "gke":
        return [
            {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"},
            *map(dict, GKE_GUARDS),
            *_gke_os_expressions(flavor),
        ]
    if opts.affinity == "label":
        exprs = []
        for item in opts.node_labels:
            key, value = parse_node_label(item, flavor)
            if value is None:
                exprs.append({"key": key, "operator": "Exists"})
            else:
                exprs.append({"key": key, "operator": "In", "values": [value]})
        return [*exprs, *map(dict, GKE_GUARDS)]  # harmless where GKE's labels never appear
    raise ValueError(f"unknown affinity mode {opts.affinity!r}")


def _disjoint(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """No node can satisfy both expression lists: some key is required In disjoint values,
    or required by one and DoesNotExist in the other."""
    def needs(exprs: Sequence[Mapping[str, Any]]) -> dict[str, set[str] | None]:
        return {e["key"]: set(e["values"]) if e["operator"] == "In" else None
                for e in exprs if e["operator"] in ("In", "Exists")}

    def absent(exprs: Sequence[Mapping[str, Any]]) -> set[str]:
        return {e["key"] for e in exprs if e["operator"] == "DoesNotExist"}

    need_a, need_b = needs(a), needs(b)
    return (any(need_a[k] is not None and need_b[k] is not None and not need_a[k] & need_b[k]
                for k in need_a.keys() & need_b.keys())
            or bool(need_a.keys() & absent(b)) or bool(need_b.keys() & absent(a)))


def _env(flavor: str, opts: RenderOptions) -> list[tuple[str, str]]:
    driver_version = opts.driver_version or DEFAULT_DRIVER_VERSION[flavor]
    validate_driver_version(flavor, driver_version)
    needs = DISTROS_BY_FLAVOR[flavor].daemonset
    env: dict[str, str] = {**CONTRACT_ENV, **dict(needs.env)}
    env["NVIDIA_DRIVER_VERSION"] = driver_version
    env["LOG_FORMAT"] = DEFAULT_LOG_FORMAT
    env["LOCK_TIMEOUT"] = DEFAULT_LOCK_TIMEOUT
    env["WHEN_IN_USE"] = DEFAULT_WHEN_IN_USE
    for key, value in opts.extra_env.items():
        if key in OWN_ENV and key not in needs.own_env:
            continue  # another distro's setting (COS artifacts mean nothing elsewhere; its pin is refused)
        env[key] = value
    return list(env.items())


def _image(flavor: str, opts: RenderOptions) -> str:
    image = DISTROS_BY_FLAVOR[flavor].image()
    ref = opts.image.replace("{flavor}", image) if opts.image else default_image(image)
    parse_image(ref)
    digest = opts.image_digests.get(flavor)
    return f"{ref}@{validate_digest(digest)}" if digest else ref


def _context(flavor: str, opts: RenderOptions) -> dict[str, Any]:
    if flavor not in FLAVORS:
        raise ValueError(f"unknown flavor {flavor!r}")
    validate_namespace(opts.namespace)
    parse_image(opts.pause_image, what="pause image", require_tag=False)
    name = daemonset_name(flavor, opts.instance and validate_instance(flavor, opts.instance))
    selector = {
        "app.kubernetes.io/name": "nvidia-driver-installer",
        "app.kubernetes.io/instance": name,
    }
    labels = {
        **selector,
        "app.kubernetes.io/component": "driver-installer",
        "app.kubernetes.io/part-of": "nvidia-driver-installer",
        "app.kubernetes.io/version": label_version(),
        "app.kubernetes.io/managed-by": "nvidia-driver-installer",
    }
    needs = DISTROS_BY_FLAVOR[flavor].daemonset
    return {
        "flavor": flavor,
        "flavor_title": FLAVOR_TITLES[flavor],
        "name": name,
        "namespace": opts.namespace,
        "selector": selector,
        "labels": labels,
        "image": _image(flavor, opts),
        "pause_image": opts.pause_image,
        "partition_gpus_image": _partition_gpus_image(flavor, opts),
        "env": _env(flavor, opts),
        "affinity": opts.affinity,
        "match_expressions": _match_expressions(flavor, opts),
        "mounts": (*CONTRACT_MOUNTS, *needs.mounts),
        "install_dir_container": INSTALL_DIR_CONTAINER,  # the partition-gpus container's
        "host_network": needs.host_network,
        "version": __version__,
    }


def _environment() -> Any:
    import importlib.resources

    import jinja2

    root = importlib.resources.files(TEMPLATE_PACKAGE).joinpath(TEMPLATE_DIR)

    def load(name: str) -> str:
        return root.joinpath(name).read_text(encoding="utf-8")

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["yaml_str"] = yaml_str
    env.filters["yaml_quoted"] = yaml_quoted
    return env


def render(flavor: str, opts: RenderOptions | None = None) -> str:
    """The DaemonSet YAML for one flavour. Raises ValueError on a bad option."""
    context = _context(flavor, opts or RenderOptions())
    return _environment().get_template(DAEMONSET_TEMPLATE).render(**context)


def render_kustomization(files: Sequence[str]) -> str:
    return _environment().get_template(KUSTOMIZATION_TEMPLATE).render(resources=list(files))


def render_files(flavors: Sequence[str], opts: RenderOptions | None = None) -> dict[str, str]:
    """``{filename: text}`` for an output directory: one DaemonSet per flavour
    plus a kustomization.yaml listing them."""
    instance = opts.instance if opts else None
    files = {daemonset_filename(f, instance): render(f, opts) for f in flavors}
    files["kustomization.yaml"] = render_kustomization(list(files))
    return files


# --- CLI ----------------------------------------------------------------------


def _bad(param: str, exc: ValueError) -> click.BadParameter:
    return click.BadParameter(str(exc), param_hint=param)


def _parse_digests(items: Sequence[str], flavors: Sequence[str]) -> dict[str, str]:
    digests: dict[str, str] = {}
    for item in items:
        flavor, sep, digest = item.rpartition("=")
        try:
            validate_digest(digest)
        except ValueError as exc:
            raise _bad("--image-digest", exc) from None
        if sep:
            if flavor not in flavors:
                raise click.BadParameter(
                    f"{flavor!r} is not one of the flavors rendered ({', '.join(flavors)})",
                    param_hint="--image-digest",
                )
            targets = [flavor]
        else:
            if len(flavors) > 1:
                raise click.BadParameter(
                    "each flavor has its own image: give FLAVOR=sha256:... per flavor",
                    param_hint="--image-digest",
                )
            targets = list(flavors)
        for f in targets:
            if f in digests:
                raise click.BadParameter(f"digest for {f} given twice", param_hint="--image-digest")
            digests[f] = digest
    return digests


@click.group("manifests")
def manifests() -> None:
    """Kubernetes manifests for the installer DaemonSet."""


@manifests.command("render")
@click.option(
    "--flavor",
    "flavors",
    type=click.Choice(FLAVORS),
    multiple=True,
    help="OS flavour to render (repeatable). Default: all, as with --all.",
)
@click.option("--all", "all_flavors", is_flag=True,
              help=f"Render every flavour ({', '.join(FLAVORS)}).")
@click.option(
    "--image",
    metavar="REF",
    help="Installer image with a tag; '{flavor}' is replaced by the flavour's image "
    "(debian: ubuntu). "
    f"Default: {DEFAULT_IMAGE_REPO}:<package version>.",
)
@click.option(
    "--image-digest",
    "image_digests",
    metavar="[FLAVOR=]sha256:HEX",
    multiple=True,
    help="Pin the image as REF@DIGEST. With several flavours, give FLAVOR=DIGEST each.",
)
@click.option(
    "--pause-image",
    metavar="REF",
    default=DEFAULT_PAUSE_IMAGE,
    show_default=True,
    help="Main (pause) container image.",
)
@click.option(
    "--driver-version",
    metavar="V",
    help="NVIDIA_DRIVER_VERSION. Default: "
    + ", ".join(f"{d.default_version} on {d.title}" for d in DISTROS) + ".",
)
@click.option("--namespace", metavar="NAME", default=DEFAULT_NAMESPACE, show_default=True)
@click.option("--partition-gpus", is_flag=True,
              help="Run GKE's partition-gpus init container after the install, as GKE's COS "
              "DaemonSets do (COS only): MIG node pools (gpu-partition-size) get their "
              "partitions; a no-op elsewhere.")
@click.option("--name", "instance", metavar="NAME",
              help="Instance name, for one DaemonSet per node pool: nvidia-driver-installer-"
              "<flavor>-NAME, its own instance label and selector, daemonset-<flavor>-NAME.yaml "
              "(e.g. the pool's name, with --affinity label --node-label "
              "cloud.google.com/gke-nodepool=NAME).")
@click.option(
    "--affinity",
    type=click.Choice(AFFINITY_MODES),
    default="gke",
    show_default=True,
    help="gke: GKE GPU nodes whose driver GKE does not manage; "
    "label: nodes with the --node-label labels (and the flavor's OS, "
    "feature.node.kubernetes.io/system-os_release.ID, unless the labels name it); "
    "none: no node affinity (one --flavor only).",
)
@click.option(
    "--node-label",
    "node_labels",
    metavar="KEY[=VALUE]",
    multiple=True,
    help="Node label required with --affinity label (repeatable; '{flavor}' is "
    "replaced). Default: " + ", ".join(DEFAULT_NODE_LABELS) + ".",
)
@click.option(
    "--env",
    "extra_env",
    metavar="KEY=VALUE",
    multiple=True,
    help="Extra installer environment variable (repeatable), e.g. FORCE_REINSTALL=1.",
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write daemonset-<flavor>.yaml and kustomization.yaml here instead of stdout.",
)
@click.option("--kind", type=click.Choice(["daemonset", "bundle-job"]), default="daemonset",
              show_default=True, help="bundle-job: the Job that builds precompiled bundles "
              "(options below; --image, --namespace, --env and --output-dir apply too).")
@click.option("--target", "targets", metavar="DRIVER@KERNEL", multiple=True,
              help="bundle-job: one bundle to build (repeatable), e.g. 550.127.05@6.8.0-1015-gke.")
@click.option("--kernel-module-type", type=click.Choice(["auto", "open", "proprietary"]),
              default="auto", show_default=True, help="bundle-job: module type built; auto: "
              "NVIDIA's default for each target's branch (open from R560), as a node with "
              "Turing or newer GPUs picks it, so its bundles are the ones those nodes look for.")
@click.option("--parallelism", type=int, default=4, show_default=True,
              help="bundle-job: pods building at once.")
@click.option("--volume-claim", metavar="PVC", help="bundle-job: keep bundles and index.json "
              "in this PersistentVolumeClaim [default: an emptyDir, for an uploader].")
@click.option("--uploader-image", metavar="REF", help="bundle-job: image of the upload hook "
              "(with gsutil, oras or curl).")
@click.option("--upload-command", metavar="SH", help="bundle-job: shell command uploading "
              "$BUNDLE_DIR/* (the bundle, its .sha256, index.json).")
def render_command(
    flavors: tuple[str, ...],
    all_flavors: bool,
    image: str | None,
    image_digests: tuple[str, ...],
    pause_image: str,
    driver_version: str | None,
    namespace: str,
    affinity: str,
    node_labels: tuple[str, ...],
    extra_env: tuple[str, ...],
    output_dir: Path | None,
    kind: str,
    instance: str | None,
    partition_gpus: bool,
    **job: Any,
) -> None:
    """Render the installer DaemonSet(s), or the bundle build Job, as YAML."""
    if kind == "bundle-job" and (instance or partition_gpus):
        raise click.UsageError(f"{'--name' if instance else '--partition-gpus'} is for "
                               "DaemonSets: it does not apply to --kind bundle-job")
    if kind == "bundle-job":  # issue 15
        from installer.bundle.job import render_command as render_job

        render_job(job, image=image, namespace=namespace, extra_env=extra_env,
                   output_dir=output_dir)
        return
    if all_flavors and flavors:
        raise click.UsageError("give --flavor or --all, not both")
    selected = tuple(dict.fromkeys(flavors)) if flavors else FLAVORS
    if partition_gpus and not set(selected) & set(PARTITION_GPUS_FLAVORS):
        raise click.UsageError("--partition-gpus: GKE runs partition-gpus only in its "
                               f"{'/'.join(PARTITION_GPUS_FLAVORS)} DaemonSets; render that flavor")
    if node_labels and affinity != "label":
        raise click.UsageError("--node-label only applies with --affinity label")
    if affinity == "none" and len(selected) > 1:
        raise click.UsageError("--affinity none puts every flavor on every node: render one "
                               "--flavor, or use --affinity gke or label")
    if image and len(selected) > 1 and "{flavor}" not in image:
        raise click.BadParameter(
            "each flavor has its own image: include '{flavor}' in REF or render one --flavor",
            param_hint="--image",
        )
    try:
        env = parse_env(extra_env)
    except ValueError as exc:
        raise _bad("--env", exc) from None
    opts = RenderOptions(
        image=image,
        image_digests=_parse_digests(image_digests, selected),
        pause_image=pause_image,
        driver_version=driver_version,
        namespace=namespace,
        affinity=affinity,
        node_labels=node_labels or DEFAULT_NODE_LABELS,
        extra_env=env,
        instance=instance,
        partition_gpus=partition_gpus,
    )
    # Validate each option on its own first, so the error names the flag.
    checks: list[tuple[str, Any]] = [
        ("--namespace", lambda: validate_namespace(namespace)),
        ("--pause-image", lambda: parse_image(pause_image, what="pause image", require_tag=False)),
    ]
    for f in selected:
        checks.append(("--image", lambda f=f: _image(f, opts)))
        if instance is not None:
            checks.append(("--name", lambda f=f: validate_instance(f, instance)))
        if driver_version:
            checks.append(
                ("--driver-version", lambda f=f: validate_driver_version(f, driver_version))
            )
        checks.append(("--node-label", lambda f=f: _match_expressions(f, opts)))
    for param, check in checks:
        try:
            check()
        except ValueError as exc:
            raise _bad(param, exc) from None
    for f in selected:
        if f not in opts.image_digests:
            click.echo(f"warning: the {f} image is pinned by tag only ({_image(f, opts)}): a "
                       "re-pushed tag changes what every GPU node runs as root; pin it with "
                       f"--image-digest {f}=sha256:<digest of the pushed image>",
                       err=True)
    try:
        if output_dir is None:
            click.echo("".join(render(f, opts) for f in selected), nl=False)
            return
        files = render_files(selected, opts)
    except ValueError as exc:  # pragma: no cover - every option was checked above
        raise click.UsageError(str(exc)) from None
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
