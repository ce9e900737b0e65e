"""One DaemonSet per node pool (issue 26): ``manifests render --name``.

Two renders side by side must be accepted by kustomize, which refuses two resources with
one id (group/version/kind, namespace, name): checked with ``kubectl kustomize`` when
kubectl is there (its kustomize is built in), and always by our own id check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from installer.commands.manifests import values
from installer.commands.manifests.cli import manifests

REPO = Path(__file__).resolve().parents[2]

yaml = pytest.importorskip("yaml")

POOL_LABEL = "cloud.google.com/gke-nodepool"


def _render(*args: str) -> CliRunner:
    return CliRunner().invoke(manifests, ["render", *args])


def _render_pool(out: Path, pool: str | None) -> list[dict]:
    args = ["--all", "--affinity", "label", "--node-label", f"{POOL_LABEL}={pool or 'gpu'}",
            "--node-label", "cloud.google.com/gke-os-distribution={flavor}", "--output-dir",
            str(out)]
    result = _render(*args, *(["--name", pool] if pool else []))
    assert result.exit_code == 0, result.output
    docs = []
    for path in sorted(out.glob("daemonset-*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _resource_id(doc: dict) -> tuple[str, str, str, str]:
    return doc["apiVersion"], doc["kind"], doc["metadata"]["namespace"], doc["metadata"]["name"]


def _selects(ds: dict, pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in ds["spec"]["selector"]["matchLabels"].items())


def _required(ds: dict) -> list[dict]:
    (term,) = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return term["matchExpressions"]


def test_without_a_name_two_pools_collide(tmp_path):
    """Why --name exists: kustomize refuses this pair (one id twice)."""
    a, b = _render_pool(tmp_path / "a", None), _render_pool(tmp_path / "b", None)
    assert {_resource_id(d) for d in a} == {_resource_id(d) for d in b}


def test_two_pools_render_side_by_side(tmp_path):
    a, b = _render_pool(tmp_path / "a", "pool-a"), _render_pool(tmp_path / "b", "pool-b")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        *(f"daemonset-{f}-pool-a.yaml" for f in sorted(values.FLAVORS)), "kustomization.yaml"]
    ids = [_resource_id(d) for d in a + b]
    assert len(set(ids)) == len(ids) == 2 * len(values.FLAVORS)
    assert {d["metadata"]["name"] for d in a} == {f"nvidia-driver-installer-{f}-pool-a"
                                                  for f in values.FLAVORS}
    for ds in a + b:
        pool = ds["metadata"]["name"].rsplit("-", 2)[-2:]
        own = ds["spec"]["template"]["metadata"]["labels"]
        assert _selects(ds, own)
        # No DaemonSet adopts another instance's pods (selectors keep them apart).
        others = [d for d in a + b if d is not ds]
        assert not any(_selects(ds, o["spec"]["template"]["metadata"]["labels"]) for o in others)
        assert {"key": POOL_LABEL, "operator": "In", "values": ["-".join(pool)]} in _required(ds)


def test_kustomize_accepts_two_pools_side_by_side(tmp_path):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl (with its built-in kustomize) is not on PATH; "
                    "test_two_pools_render_side_by_side checks the ids")
    _render_pool(tmp_path / "pool-a", "pool-a")
    _render_pool(tmp_path / "pool-b", "pool-b")
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - pool-a\n  - pool-b\n")
    proc = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = sorted(d["metadata"]["name"] for d in yaml.safe_load_all(proc.stdout) if d)
    assert names == sorted(f"nvidia-driver-installer-{f}-{p}" for f in values.FLAVORS
                           for p in ("pool-a", "pool-b"))
    # and the same pair without --name is refused, as the issue saw
    _render_pool(tmp_path / "pool-a", None)
    _render_pool(tmp_path / "pool-b", None)
    for d in ("pool-a", "pool-b"):
        for p in (tmp_path / d).glob("daemonset-*-pool-*.yaml"):
            p.unlink()
    clash = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
    assert clash.returncode != 0 and "already registered id" in clash.stderr, clash.stderr


@pytest.mark.parametrize("flavor", values.FLAVORS)
def test_gke_guards_hold_with_label_affinity(tmp_path, flavor):
    (ds,) = [d for d in _render_pool(tmp_path, "pool-a")
             if d["metadata"]["name"] == f"nvidia-driver-installer-{flavor}-pool-a"]
    for guard in values.GKE_GUARDS:
        assert guard in _required(ds)


def test_no_name_keeps_the_committed_names():
    result = _render("--flavor", "ubuntu")
    (ds,) = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert ds["metadata"]["name"] == "nvidia-driver-installer-ubuntu"
    assert values.daemonset_filename("ubuntu") == "daemonset-ubuntu.yaml"


@pytest.mark.parametrize("name, fragment", [
    ("Pool_A", "not a DNS-1123 label"),
    ("-a", "not a DNS-1123 label"),
    ("p" * 40, "longer than 63 characters"),
])
def test_bad_names_are_usage_errors(name, fragment):
    result = _render("--all", "--name", name)
    assert result.exit_code == 2, result.output
    assert "--name" in result.output and fragment in result.output
    assert "Traceback" not in result.output


def test_name_does_not_apply_to_the_bundle_job():
    result = _render("--kind", "bundle-job", "--name", "pool-a", "--target",
                     "550.127.05@6.8.0-1015-gke")
    assert result.exit_code == 2 and "--name" in result.output


def test_the_readme_recipe_renders_two_pools(tmp_path):
    """docs/operator/install.md "One DaemonSet per pool" (the README's until issue 41), as a
    newcomer runs it (kubectl apply left out)."""
    import re
    import sys

    readme = (REPO / "docs/operator/install.md").read_text()
    section = readme.split("## One DaemonSet per pool", 1)[1].split("\n## ", 1)[0]
    script = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    script = script.split("\nkubectl ", 1)[0]  # up to the apply: no cluster here
    script = script.replace("sha256:<from make push>", "sha256:" + "ab" * 32)
    script = re.sub(r"<sha256 of [^>]*\.run>", "cd" * 32, script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-driver-installer").write_text(
        f"#!/bin/sh\nexec {sys.executable} -m installer \"$@\"\n")
    (bin_dir / "nvidia-driver-installer").chmod(0o755)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin",
                               "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    docs = [d for p in sorted((tmp_path / "deploy").rglob("daemonset-*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]
    assert sorted(d["metadata"]["name"] for d in docs) == [
        "nvidia-driver-installer-cos-gpu-b", "nvidia-driver-installer-ubuntu-gpu-a"]
    kubectl = shutil.which("kubectl")
    if kubectl:
        built = subprocess.run([kubectl, "kustomize", str(tmp_path / "deploy")],
                               capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr


@pytest.mark.parametrize("where", ["/proc/nope", "/dev/null/x"])
def test_an_unwritable_output_dir_is_one_line_exit_2(where):
    """Issue 26: was a traceback (exit 1), or advice meant for the pod."""
    result = _render("--all", "--output-dir", where)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for --output-dir: cannot write the manifests "
                           f"to {where}: ")
    assert "Traceback" not in result.output and "pod" not in result.output
