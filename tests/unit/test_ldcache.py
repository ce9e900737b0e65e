from pathlib import PurePosixPath

import pytest

from installer.ldcache import plan_host_entry

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
