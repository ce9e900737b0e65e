from pathlib import PurePosixPath

import pytest

from installer.kmod.ldcache import plan_host_entry

LIB = PurePosixPath("/home/kubernetes/bin/nvidia/lib64")


@pytest.mark.parametrize(
    ("conf", "expected_text", "drop_in"),
    [
        pytest.param("include /etc/ld.so.conf.d/*.conf\n", "include /etc/ld.so.conf.d/*.conf\n", True,
                     id="include-uses-drop-in"),
        pytest.param("/usr/lib\n", f"/usr/lib\n{LIB}\n", False, id="no-include-appends-once"),
        pytest.param(f"include /etc/ld.so.conf.d/*.conf\n{LIB}\n{LIB}\n{LIB}\n",
                     f"include /etc/ld.so.conf.d/*.conf\n{LIB}\n", False,
                     id="gke-duplicates-collapsed"),
        pytest.param("", f"{LIB}\n", False, id="empty"),
    ],
)
def test_plan_host_entry(conf, expected_text, drop_in):
    assert plan_host_entry(conf, LIB) == (expected_text, drop_in)


def test_plan_is_idempotent():
    text, _ = plan_host_entry("/usr/lib\n", LIB)
    assert plan_host_entry(text, LIB) == (text, False)


@pytest.mark.parametrize("conf", ["include /etc/ld.so.conf.d/*.conf\n", "/usr/lib\n", ""])
def test_remove_host_undoes_update_host_and_refreshes_the_cache(tmp_path, conf):
    """The real ldconfig -r on a plain directory: what update_host adds, remove_host takes
    away (the host's own lines and other drop-ins stay); a second remove changes nothing."""
    from installer.host.hostroot import HostRoot
    from installer.host.runner import Runner
    from installer.kmod.ldcache import remove_host, update_host

    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text(conf)
    (tmp_path / "etc/ld.so.conf.d/other.conf").write_text("/opt/other\n")
    host, runner = HostRoot(tmp_path), Runner()
    update_host(host, runner, LIB)
    (tmp_path / "etc/ld.so.cache").unlink()
    changed = remove_host(host, runner, LIB)
    assert changed == (["/etc/ld.so.conf.d/nvidia.conf"] if "include" in conf
                       else ["/etc/ld.so.conf"])
    assert (tmp_path / "etc/ld.so.conf").read_text() == conf
    assert (tmp_path / "etc/ld.so.conf.d/other.conf").exists()
    assert (tmp_path / "etc/ld.so.cache").exists()  # refreshed
    assert remove_host(host, runner, LIB) == []


def test_parse_ldconfig_p_keeps_64_bit_entries_in_lookup_order():
    from installer.kmod.ldcache import parse_ldconfig_p

    text = ("3 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
            "\tlibcuda.so.1 (libc6) => /usr/lib32/libcuda.so.1\n"
            f"\tlibcuda.so.1 (libc6,x86-64) => {LIB}/libcuda.so.1\n")
    assert parse_ldconfig_p(text) == {
        "libcuda.so.1": ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", f"{LIB}/libcuda.so.1"]}
