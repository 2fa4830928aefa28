"""Peer authentication for the replay server: ZeroMQ CURVE keys and the server's allow-list.

Keys are ZeroMQ certificate files (zmq.auth.create_certificates): NAME.key holds the public key,
NAME.key_secret the public + secret key. The server loads its own NAME.key_secret and an
allow-list of client public keys (directories of *.key files and/or z85 strings); a ZAP handler
accepts a CURVE handshake only from a key on the list, so a client with an unknown key never
gets a reply (its connection is dropped during the handshake). Traffic of accepted peers is
encrypted (CurveZMQ). `plaintext` mode skips all of this, for a private fabric only.
"""
from __future__ import annotations

from pathlib import Path


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Writes DIR/NAME.key and DIR/NAME.key_secret (mode 0600); returns (public, secret) paths."""
    import zmq.auth

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(directory), name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def load_secret(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys of a NAME.key_secret certificate."""
    import zmq.auth

    public, secret = zmq.auth.load_certificate(str(path))
    if secret is None:
        raise ValueError(f"{path}: no secret key in this certificate (use NAME.key_secret)")
    return public, secret


def load_public(source: str | Path | bytes) -> bytes:
    """A z85 public key: from a certificate file, or a 40-character z85 string."""
    import zmq.auth

    if isinstance(source, bytes):
        return source
    if len(str(source)) == 40 and not Path(source).exists():
        return str(source).encode()
    public, _ = zmq.auth.load_certificate(str(source))
    return public


def allowed_keys(entries) -> set[bytes]:
    """The allow-list: each entry a directory of *.key files, one certificate file, or a z85 key."""
    keys: set[bytes] = set()
    for entry in entries:
        path = Path(entry) if not isinstance(entry, bytes) else None
        if path is not None and path.is_dir():
            keys.update(load_public(p) for p in sorted(path.glob("*.key")))
        else:
            keys.add(load_public(entry))
    return keys


class AllowList:
    """A ZAP credentials provider: accepts exactly the listed public keys."""

    def __init__(self, keys: set[bytes]):
        self.keys = set(keys)
        self.refused = 0

    def callback(self, domain, key: bytes) -> bool:
        if key in self.keys:
            return True
        self.refused += 1
        return False
