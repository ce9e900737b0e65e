"""Appended kernel module signatures (the kernel's ``scripts/sign-file`` layout).

A signed module is::

    module bytes | PKCS#7 (DER, detached) | struct module_signature | MAGIC

``struct module_signature`` (include/linux/module_signature.h) is 12 bytes:
``u8 algo, hash, id_type, signer_len, key_id_len; u8 pad[3]; __be32 sig_len``.
For PKCS#7 everything but ``id_type`` (2, PKEY_ID_PKCS7) and ``sig_len`` is 0:
the signer and the hash live inside the PKCS#7 blob. Pure functions only.
"""

from __future__ import annotations

import struct

from installer.base.dataclass import dataclass

MAGIC = b"~Module signature appended~\n"
PKEY_ID_PKCS7 = 2
_STRUCT = struct.Struct(">BBBBB3sI")  # 12 bytes, sig_len big-endian
TRAILER_SIZE = _STRUCT.size + len(MAGIC)


class SignatureFormatError(ValueError):
    """Bytes that end in the magic but whose trailer is not a valid PKCS#7 signature."""


@dataclass(frozen=True)
class Signature:
    module_size: int  # bytes of the module before the signature
    pkcs7: bytes
    id_type: int


def module_signature_struct(sig_len: int) -> bytes:
    return _STRUCT.pack(0, 0, PKEY_ID_PKCS7, 0, 0, b"\0\0\0", sig_len)


def append_signature(module: bytes, pkcs7: bytes) -> bytes:
    """``module`` with the detached PKCS#7 signature appended (as ``sign-file -s``)."""
    if not pkcs7:
        raise ValueError("empty signature")
    if has_signature(module):
        raise ValueError("the module is already signed")
    return module + pkcs7 + module_signature_struct(len(pkcs7)) + MAGIC


def has_signature(data: bytes) -> bool:
    return data.endswith(MAGIC)


def parse_signature(data: bytes) -> Signature | None:
    """The appended signature of ``data``; None when it has none.

    Raises SignatureFormatError when the magic is there but the trailer is not
    what the kernel accepts (mod_check_sig's checks).
    """
    if not has_signature(data):
        return None
    if len(data) < TRAILER_SIZE:
        raise SignatureFormatError("too short for a module signature")
    end = len(data) - len(MAGIC)
    algo, hash_, id_type, signer_len, key_id_len, _pad, sig_len = _STRUCT.unpack_from(
        data, end - _STRUCT.size)
    if id_type != PKEY_ID_PKCS7:
        raise SignatureFormatError(f"signature id_type {id_type}, not PKCS#7 ({PKEY_ID_PKCS7})")
    if algo or hash_ or signer_len or key_id_len:
        raise SignatureFormatError("PKCS#7 module signature with non-zero algo/hash/signer/key id")
    start = end - _STRUCT.size - sig_len
    if sig_len == 0 or start < 0:
        raise SignatureFormatError(f"signature length {sig_len} does not fit the file")
    return Signature(start, data[start:end - _STRUCT.size], id_type)

