"""Validation of what a user asks the manifests for: pure, each raising ValueError with a
one-line reason naming the value, so a bad value is a usage error (exit 2) and never a
manifest the API server or the installer would reject later."""

from __future__ import annotations

import re
from collections.abc import Iterable

from installer.base.envvars import INSTALLER_ENV_VARS, PASSTHROUGH_ENV_VARS
from installer.commands.manifests.values import DISTROS_BY_FLAVOR, FIXED_ENV, daemonset_name, image_tag
from installer.driver.nvidia_options import too_old

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
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

def _dns_label(value: str, what: str) -> str:
    _check_len(value, 63, what)
    if not _DNS_LABEL.match(value):
        raise ValueError(f"{what} {value!r} is not a DNS-1123 label (lower case, digits, '-')")
    return value

def validate_namespace(value: str) -> str:
    return _dns_label(value, "namespace")

def validate_config_map(value: str) -> str:
    """A ConfigMap's name: a DNS-1123 label (the stricter form of the subdomain it may be)."""
    return _dns_label(value, "ConfigMap name")


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
        if not DNS_SUBDOMAIN.match(prefix):
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

def validate_driver_sha256(value: str, driver_version: str | None) -> str:
    """``--driver-sha256``: the SHA-256 of one .run, so of one explicit --driver-version."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise ValueError(f"{value!r} is not a SHA-256 (64 hex digits) of the NVIDIA .run")
    if not (driver_version and driver_version[:1].isdigit()):
        raise ValueError("it pins one .run: give --driver-version, the version it is the "
                         "SHA-256 of (a version, not an alias or the default)")
    return value.lower()


def validate_metrics_file(value: str) -> str:
    """``--metrics-file``: a host path node_exporter's textfile collector reads."""
    if not value.startswith("/") or ".." in value.split("/") or not value.endswith(".prom"):
        raise ValueError(f"{value!r} is not an absolute host path of a *.prom file (the "
                         "textfile collector reads only those), e.g. "
                         "/var/lib/node_exporter/textfile_collector/nvidia_driver_installer.prom")
    return value


# Native sidecars (init containers with restartPolicy: Always) run as sidecars by default
# from Kubernetes 1.29 (KEP-753, SidecarContainers beta and on by default in 1.29).
MIN_KUBERNETES_FOR_SIDECARS = (1, 29)
# What `kubectl version` prints as the server's: v1.29.4, v1.30.2-gke.1587003, 1.31.
_KUBE_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+][\w.+-]*)?")


def parse_kube_version(text: str) -> tuple[int, int]:
    """``v1.30.2-gke.1587003`` -> (1, 30); ValueError saying what a version looks like."""
    m = _KUBE_VERSION.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes version: give the server's, as "
                         "`kubectl version` prints it (e.g. v1.30.2 or 1.30)")
    return int(m.group(1)), int(m.group(2))


def check_sidecars_supported(kube: tuple[int, int], rendered: str) -> None:
    """ValueError when ``rendered`` has native sidecars and the cluster is older than 1.29."""
    if "restartPolicy: Always" in rendered and kube < MIN_KUBERNETES_FOR_SIDECARS:
        need = ".".join(map(str, MIN_KUBERNETES_FOR_SIDECARS))
        raise ValueError(f"Kubernetes {kube[0]}.{kube[1]} does not run the native sidecars this "
                         f"render adds (init containers with restartPolicy: Always run as "
                         f"sidecars from {need}): upgrade the cluster to {need} or newer, or "
                         "render without the sidecar options (--persistenced, --nvswitch, --health)")


# The placeholders --image and --node-label fill in; any other {word} is a typo, named as
# one (`{flavour}` used to get only "not a valid image reference").
PLACEHOLDERS = ("{flavor}",)
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def fill_flavor(text: str, flavor: str, *, what: str) -> str:
    """``text`` with ``{flavor}`` replaced; ValueError naming any other placeholder."""
    unknown = [p for p in _PLACEHOLDER.findall(text) if p not in PLACEHOLDERS]
    if unknown:
        raise ValueError(f"{what} {text!r}: unknown placeholder {unknown[0]!r}; the known one "
                         f"is {', '.join(PLACEHOLDERS)} (the flavor's image name)")
    return text.replace("{flavor}", flavor)


def parse_node_label(item: str, flavor: str) -> tuple[str, str | None]:
    """``key=value`` (or bare ``key``: label must exist) with ``{flavor}`` filled in."""
    item = fill_flavor(item, flavor, what="node label")
    key, sep, value = item.partition("=")
    validate_label_key(key)
    if not sep:
        return key, None
    validate_label_value(value)
    return key, value
