"""DaemonSet manifests: rendered from jinja2 templates shipped in the package.

One DaemonSet per distro (``daemonset-<flavor>.yaml``, from what each class in
``distros/`` declares) following the pod contract of docs/contract.md §2. The defaults
are committed under ``manifests/`` and a test fails when they drift from a fresh render
(``make manifests`` fixes it). Every value is validated (``validate``) before any
template is touched.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

import jinja2

from installer import __version__
from installer.base import podcontract
from installer.base.dataclass import dataclass
from installer.commands.manifests.validate import (
    fill_flavor,
    parse_image,
    parse_node_label,
    validate_config_map,
    validate_digest,
    validate_driver_version,
    validate_instance,
    validate_namespace,
)
from installer.commands.manifests.values import (
    CONTRACT_ENV,
    CONTRACT_MOUNTS,
    DEFAULT_DRIVER_VERSION,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_LOG_FORMAT,
    DEFAULT_NAMESPACE,
    DEFAULT_NODE_LABELS,
    DEFAULT_PAUSE_IMAGE,
    DEFAULT_WHEN_IN_USE,
    DISTROS_BY_FLAVOR,
    FLAVOR_TITLES,
    FLAVORS,
    GKE_GUARDS,
    GKE_OS_DISTRIBUTIONS,
    GKE_OS_LABEL,
    HOST_ROOT_CONTAINER,
    INSTALL_DIR_CONTAINER,
    OS_ID_LABEL,
    OWN_ENV,
    PARTITION_GPUS_FLAVORS,
    PARTITION_GPUS_IMAGE,
    daemonset_filename,
    daemonset_name,
    default_image,
    is_placeholder,
    label_version,
)
from installer.records import readiness

TEMPLATE_PACKAGE = "installer"
TEMPLATE_DIR = "templates"
DAEMONSET_TEMPLATE = "daemonset.yaml.j2"
KUSTOMIZATION_TEMPLATE = "kustomization.yaml.j2"
POD_MONITORING_TEMPLATE = "pod-monitoring.yaml.j2"
POD_MONITORING_FILE = "podmonitoring.yaml"

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
    # NVIDIA's daemons as native sidecars (installer/commands/sidecar_cli.py).
    nvswitch: bool = False  # the fabric manager, for NVSwitch node pools
    fabric_manager_config: str | None = None  # a ConfigMap with fabricmanager.cfg
    persistenced: bool = False  # nvidia-persistenced instead of `nvidia-smi -pm 1`
    partition_gpus_image: str = PARTITION_GPUS_IMAGE
    driver_sha256: str | None = None  # pins the .run of driver_version
    metrics_file: str | None = None  # host path of a node_exporter textfile
    health: bool = False  # the health sidecar: /metrics and /healthz on metrics_port
    metrics_port: int = 9402
    pod_monitoring: bool = False  # with health: GKE Managed Prometheus's PodMonitoring


# The daemon sidecars, in the order they start (before the install: each waits for the driver).
FABRIC_MANAGER_CONFIG_DIR = "/etc/nvidia-fabricmanager"


def sidecars(opts: RenderOptions) -> list[dict[str, Any]]:
    """The daemon sidecars the options ask for, each as the template draws it."""
    out = []
    if opts.fabric_manager_config is not None and not opts.nvswitch:
        raise ValueError("a fabric manager config needs the fabric manager sidecar (--nvswitch)")
    for daemon in podcontract.DAEMONS:
        if not getattr(opts, daemon.render_flag):
            continue
        config = None
        if daemon.config_env:  # its own config file (the fabric manager's), when given
            config = opts.fabric_manager_config and validate_config_map(opts.fabric_manager_config)
        out.append({
            "name": daemon.container, "command": daemon.command, "config_map": config,
            "daemon": daemon.name,
            "env": [(daemon.config_env, f"{FABRIC_MANAGER_CONFIG_DIR}/fabricmanager.cfg")]
            if config else [],
            "why": daemon.why})
    if opts.health:  # not a daemon the install waits for: after the registry's sidecars
        out.append(health_sidecar(opts.metrics_port))
    return out


def health_sidecar(port: int) -> dict[str, Any]:
    """``sidecar health`` (docs/health-and-metrics.md): no daemon the install waits for, a
    port Prometheus scrapes, /healthz as its readiness (a node that needs a reset or a reboot
    shows as a not-ready pod) and /metrics as its liveness (200 while it serves)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"the metrics port {port} is not a TCP port (1-65535)")
    return {"name": "nvidia-gpu-health", "command": "health", "config_map": None,
            "daemon": None, "port": port,
            "env": [("NVIDIA_METRICS_PORT", str(port)),
                    ("ROOT_MOUNT_DIR", HOST_ROOT_CONTAINER)],
            # driver-ready's dir alone (readiness.READY_HOST_PATH): the verdict's lines
            "readiness_dir": str(readiness.READY_HOST_PATH.parent).lstrip("/"),
            "why": ("Watches the GPUs after the install: Xid events, GPUs gone, daemons",
                    "down; serves /metrics and /healthz (docs/health-and-metrics.md).")}


def match_expressions(flavor: str, opts: RenderOptions) -> list[dict[str, Any]]:
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
        elif not {OS_ID_LABEL, GKE_OS_LABEL} & ours:
            exprs += _gke_os_expressions(flavor) if _gke_labels(opts) else [_os_id_expression(flavor)]
    return exprs


def _gke_labels(opts: RenderOptions) -> bool:
    """Node labels only GKE sets (cloud.google.com/gke-nodepool, …): there GKE's own OS label
    tells the flavours apart; Node Feature Discovery, whose label does elsewhere, is rarely
    installed on GKE."""
    return any(item.partition("=")[0].startswith("cloud.google.com/") for item in opts.node_labels)


def needs_nfd(flavor: str, opts: RenderOptions) -> bool:
    """The flavour's DaemonSet selects nodes by NFD's os-release label the user did not ask
    for: on a cluster without Node Feature Discovery it schedules no pod."""
    asked = {parse_node_label(item, flavor)[0] for item in opts.node_labels}
    return opts.affinity == "label" and OS_ID_LABEL not in asked and \
        any(e["key"] == OS_ID_LABEL for e in match_expressions(flavor, opts))


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



def _partition_gpus_image(flavor: str, opts: RenderOptions) -> str:
    """GKE's partition-gpus image where GKE runs it (its COS DaemonSets), else ""."""
    return (opts.partition_gpus_image
            if opts.partition_gpus and flavor in PARTITION_GPUS_FLAVORS else "")


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
        exprs: list[dict[str, Any]] = []
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
    return (any((va := need_a[k]) is not None and (vb := need_b[k]) is not None and not va & vb
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
    if opts.driver_sha256:
        env["NVIDIA_DRIVER_SHA256"] = opts.driver_sha256.lower()
    if opts.metrics_file:
        env["NVIDIA_INSTALLER_METRICS_FILE"] = opts.metrics_file
    for key, value in opts.extra_env.items():
        if key in OWN_ENV and key not in needs.own_env:
            continue  # another distro's setting (COS artifacts mean nothing elsewhere; its pin is refused)
        env[key] = value
    if required := " ".join(s["daemon"] for s in sidecars(opts) if s["daemon"]):
        env["NVIDIA_REQUIRED_DAEMONS"] = required  # ready only with the sidecars up
    return list(env.items())


def image_ref(flavor: str, opts: RenderOptions) -> str:
    image = DISTROS_BY_FLAVOR[flavor].image()
    ref = fill_flavor(opts.image, image, what="image") if opts.image else default_image(image)
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
        "image": image_ref(flavor, opts),
        "placeholder": is_placeholder(image_ref(flavor, opts)),
        "pause_image": opts.pause_image,
        "partition_gpus_image": _partition_gpus_image(flavor, opts),
        "sidecars": sidecars(opts),
        "fabric_manager_config": opts.fabric_manager_config,
        "fabric_manager_config_dir": FABRIC_MANAGER_CONFIG_DIR,
        "env": _env(flavor, opts),
        "affinity": opts.affinity,
        "match_expressions": match_expressions(flavor, opts),
        "mounts": (*CONTRACT_MOUNTS, *needs.mounts),
        "install_dir_container": INSTALL_DIR_CONTAINER,  # the partition-gpus container's
        "host_root_container": HOST_ROOT_CONTAINER,
        "host_network": needs.host_network,
        "version": __version__,
    }


def environment() -> jinja2.Environment:
    """The templates shipped in the package, strict: an unset variable is an error."""
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
    return environment().get_template(DAEMONSET_TEMPLATE).render(**context)


def render_pod_monitoring(flavors: Sequence[str], opts: RenderOptions) -> str:
    """GKE Managed Prometheus's PodMonitoring of the rendered DaemonSets' pods: their
    ``metrics`` port (the health sidecar's), every 30 s."""
    suffix = f"-{opts.instance}" if opts.instance else ""
    return environment().get_template(POD_MONITORING_TEMPLATE).render(
        name=f"nvidia-driver-installer{suffix}", namespace=opts.namespace,
        instances=[daemonset_name(f, opts.instance) for f in flavors])


def render_kustomization(files: Sequence[str]) -> str:
    return environment().get_template(KUSTOMIZATION_TEMPLATE).render(resources=list(files))


def render_files(flavors: Sequence[str], opts: RenderOptions | None = None) -> dict[str, str]:
    """``{filename: text}`` for an output directory: one DaemonSet per flavour
    plus a kustomization.yaml listing them."""
    instance = opts.instance if opts else None
    files = {daemonset_filename(f, instance): render(f, opts) for f in flavors}
    if opts and opts.pod_monitoring:
        files[POD_MONITORING_FILE] = render_pod_monitoring(flavors, opts)
    files["kustomization.yaml"] = render_kustomization(list(files))
    return files
