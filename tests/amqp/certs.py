"""A certificate authority and a server certificate made at test time, for the hub's TLS.

With the ``cryptography`` package when it is installed, else with the ``openssl`` command. The
certificates follow what strict verifiers ask (Python 3.13's ``VERIFY_X509_STRICT``): a CA with
critical basic constraints, key usage and a key identifier; a server certificate with its names
(DNS or IP) as subject alternative names, server-auth usage and the authority's key identifier.
Nothing here is committed: every run makes its own, valid for a day.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("cryptography", "openssl")


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the authority's certificate: what a client trusts (connection_verify=...)
    cert: Path  # the server's certificate
    key: Path  # the server's private key, mode 0600


def available_tools() -> list[str]:
    """The ways this machine can make certificates, preferred first."""
    tools = []
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pass
    else:
        tools.append("cryptography")
    if shutil.which("openssl"):
        tools.append("openssl")
    return tools


def make_certificates(folder: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1"), tool: str = "") -> Certificates:
    """A CA and a server certificate for ``hosts`` (names or IP addresses) in ``folder``, made with
    ``tool`` (default: the first of ``available_tools()``). Raises RuntimeError if no tool is there."""
    tools = available_tools()
    tool = tool or (tools[0] if tools else "")
    if tool not in tools:
        raise RuntimeError(f"cannot make certificates with {tool or 'anything'}: neither cryptography nor openssl")
    folder.mkdir(parents=True, exist_ok=True)
    made = Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    (_with_cryptography if tool == "cryptography" else _with_openssl)(made, list(hosts))
    os.chmod(made.key, 0o600)
    return made


def _with_cryptography(made: Certificates, hosts: list[str]) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Leaseboard test CA")])
    usage = dict(
        content_commitment=False, data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, key_encipherment=False, **usage),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def name(host: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            return x509.DNSName(host)

    names = [name(host) for host in hosts]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, key_encipherment=True, **usage),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    made.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    made.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(made.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )


def _with_openssl(made: Certificates, hosts: list[str]) -> None:
    def names() -> str:
        out = []
        for host in hosts:
            try:
                ipaddress.ip_address(host)
                out.append(f"IP:{host}")
            except ValueError:
                out.append(f"DNS:{host}")
        return ",".join(out)

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        ca_key, csr, ext = work / "ca.key", work / "server.csr", work / "server.ext"
        ext.write_text(
            "basicConstraints = critical, CA:FALSE\n"
            "keyUsage = critical, digitalSignature, keyEncipherment\n"
            "extendedKeyUsage = serverAuth\n"
            f"subjectAltName = {names()}\n"
            "subjectKeyIdentifier = hash\n"
            "authorityKeyIdentifier = keyid\n"
        )
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        run = [
            [
                "openssl",
                "req",
                "-x509",
                *ec,
                "-keyout",
                str(ca_key),
                "-out",
                str(made.ca),
                "-days",
                "1",
                "-subj",
                "/CN=Leaseboard test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE,pathlen:0",
                "-addext",
                "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
                "-addext",
                "subjectKeyIdentifier=hash",
            ],
            ["openssl", "req", "-new", *ec, "-keyout", str(made.key), "-out", str(csr), "-subj", f"/CN={hosts[0]}"],
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(made.ca),
                "-CAkey",
                str(ca_key),
                "-CAserial",
                str(work / "ca.srl"),
                "-CAcreateserial",
                "-out",
                str(made.cert),
                "-days",
                "1",
                "-sha256",
                "-extfile",
                str(ext),
            ],
        ]
        for command in run:
            subprocess.run(command, check=True, capture_output=True, timeout=60, cwd=work)


def encrypt_key(key: Path, target: Path, password: str) -> Path:
    """``key`` encrypted with ``password`` (AES-256, PKCS#8) into ``target``, mode 0600; returns it."""
    if "cryptography" in available_tools():
        from cryptography.hazmat.primitives import serialization

        loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
        target.write_bytes(
            loaded.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(password.encode()),
            )
        )
    else:
        subprocess.run(
            [
                "openssl",
                "pkey",
                "-in",
                str(key),
                "-aes256",
                "-passout",
                "env:LEASEBOARD_TEST_PASSWORD",
                "-out",
                str(target),
            ],
            check=True,
            capture_output=True,
            timeout=60,
            env={**os.environ, "LEASEBOARD_TEST_PASSWORD": password},
        )
    os.chmod(target, 0o600)
    return target
