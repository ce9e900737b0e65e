"""Make a module look as if it was built for another kernel release.

Two things differ in a module built against another kernel's headers: the
release in its ``vermagic`` and the symbol CRCs it was linked with. With
CONFIG_MODVERSIONS the kernel skips the release when it compares vermagic and
refuses on the CRCs instead ("disagrees about version of symbol
module_layout"), so both are rewritten here: the release (same length), and
the CRC recorded for ``module_layout``.

Usage: python3 other_kernel.py MODULE.ko RUNNING_RELEASE OTHER_RELEASE
"""

import sys


def patch(data: bytes, release: str, other: str) -> bytes:
    old, new = release.encode(), other.encode()
    if len(old) != len(new):
        raise ValueError("the other release must be as long as the running one")
    needle = b"vermagic=" + old + b" "
    if needle not in data:
        raise ValueError(f"no {needle!r} in the module")
    data = data.replace(needle, b"vermagic=" + new + b" ")
    # __versions: struct modversion_info { unsigned long crc; char name[56]; }
    name = b"module_layout".ljust(56, b"\0")
    at = data.find(name)
    if at >= 8:
        crc = bytearray(data[at - 8 : at])
        crc[0] ^= 0xFF
        crc[1] ^= 0x5A
        data = data[: at - 8] + bytes(crc) + data[at:]
    return data


def main(path: str, release: str, other: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(patch(data, release, other))


if __name__ == "__main__":
    main(*sys.argv[1:4])
