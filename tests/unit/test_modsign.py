"""The appended module signature layout (scripts/sign-file, module_signature.h)."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from installer.kmod import modsign
from tests.fixtures.kernel import UBUNTU_KERNEL, fake_ko

MAGIC = b"~Module signature appended~\n"


def test_exact_byte_layout():
    module, pkcs7 = b"\x7fELF module body", b"\x30\x82\x01\x02PKCS7-DER"
    out = modsign.append_signature(module, pkcs7)
    assert out[:len(module)] == module
    assert out[len(module):len(module) + len(pkcs7)] == pkcs7
    trailer = out[len(module) + len(pkcs7):]
    assert trailer == bytes([0, 0, 2, 0, 0, 0, 0, 0]) + struct.pack(">I", len(pkcs7)) + MAGIC
    assert len(trailer) == 12 + 28 == modsign.TRAILER_SIZE
    assert modsign.has_signature(out) and not modsign.has_signature(module)


def test_length_is_big_endian():
    pkcs7 = b"x" * 0x0102
    out = modsign.append_signature(b"m", pkcs7)
    assert out[-len(MAGIC) - 4:-len(MAGIC)] == b"\x00\x00\x01\x02"


def test_parse_round_trip():
    module, pkcs7 = fake_ko("nvidia", UBUNTU_KERNEL), b"sig" * 50
    out = modsign.append_signature(module, pkcs7)
    sig = modsign.parse_signature(out)
    assert sig == modsign.Signature(len(module), pkcs7, modsign.PKEY_ID_PKCS7)
    assert out[:sig.module_size] == module
    assert modsign.parse_signature(module) is None


@pytest.mark.parametrize("bad", [
    MAGIC,  # nothing before the magic
    b"m" + struct.pack(">BBBBB3sI", 0, 0, 2, 0, 0, b"\0\0\0", 999) + MAGIC,  # length too big
    b"m" * 9 + struct.pack(">BBBBB3sI", 0, 0, 1, 0, 0, b"\0\0\0", 4) + MAGIC,  # not PKCS#7
    b"m" * 9 + struct.pack(">BBBBB3sI", 0, 0, 2, 0, 0, b"\0\0\0", 0) + MAGIC,  # empty
])
def test_malformed_trailers_are_rejected(bad):
    with pytest.raises(modsign.SignatureFormatError):
        modsign.parse_signature(bad)


def test_refuses_double_signing_and_empty_signature():
    signed = modsign.append_signature(b"m", b"s")
    with pytest.raises(ValueError):
        modsign.append_signature(signed, b"s")
    with pytest.raises(ValueError):
        modsign.append_signature(b"m", b"")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_real_pkcs7_from_openssl(tmp_path):
    """A detached DER PKCS#7 made as sign-file makes it (-binary -noattr, no certs needed
    in the blob) round-trips, and openssl verifies the stripped module against it."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=throwaway module key"],
                   check=True, capture_output=True)
    module = tmp_path / "nvidia.ko"
    module.write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
    sig = tmp_path / "nvidia.ko.sig"
    subprocess.run(["openssl", "cms", "-sign", "-binary", "-noattr", "-outform", "DER",
                    "-in", module, "-signer", cert, "-inkey", key, "-out", sig, "-md", "sha256"],
                   check=True, capture_output=True)
    pkcs7 = sig.read_bytes()
    assert pkcs7[:1] == b"\x30"  # a DER SEQUENCE
    signed = modsign.append_signature(module.read_bytes(), pkcs7)
    assert signed.endswith(MAGIC)
    assert struct.unpack(">I", signed[-len(MAGIC) - 4:-len(MAGIC)])[0] == len(pkcs7)
    parsed = modsign.parse_signature(signed)
    assert parsed is not None and parsed.pkcs7 == pkcs7
    content = tmp_path / "content"
    content.write_bytes(signed[:parsed.module_size])
    detached = tmp_path / "detached.der"
    detached.write_bytes(parsed.pkcs7)
    subprocess.run(["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in", detached,
                    "-content", content, "-CAfile", cert, "-purpose", "any", "-out", "/dev/null"],
                   check=True, capture_output=True)
