"""Per-run mesh certificates with the openssl CLI: one CA, one key pair per
workload identity, SPIFFE-like URI SANs (spiffe://cluster.local/ns/default/sa/<name>),
as Istio's CA issues them. Nothing is reused between runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

TRUST_DOMAIN = "cluster.local"


def spiffe(sa: str, ns: str = "default") -> str:
    return f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/{sa}"


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {r.stderr.strip()}")


def make_certs(directory: Path, identities: tuple[str, ...],
               ca: tuple[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Writes ca.pem and <id>.pem/<id>-key.pem; returns {id: {cert, key, ca, san}}. The CA is a
    fresh one, or `ca` = (cert PEM, key PEM): istiod's, so that its proxies trust these."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl CLI not found: install openssl (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    if ca is not None:
        (directory / "ca.pem").write_text(ca[0])
        (directory / "ca-key.pem").write_text(ca[1])
    else:
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", "/O=meshlab/CN=meshlab root CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 cwd=directory)
    out = {}
    for ident in identities:
        san = spiffe(ident)
        ext = directory / f"{ident}.ext"
        ext.write_text("basicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature,keyEncipherment\n"
                       "extendedKeyUsage=serverAuth,clientAuth\n"
                       f"subjectAltName=critical,URI:{san}\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{ident}-key.pem", "-out", f"{ident}.csr", "-subj", "/O=meshlab", cwd=directory)
        _openssl("x509", "-req", "-in", f"{ident}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                 "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", f"{ident}.pem", cwd=directory)
        out[ident] = {"cert": str(directory / f"{ident}.pem"), "key": str(directory / f"{ident}-key.pem"),
                      "ca": str(directory / "ca.pem"), "san": san}
    return out
