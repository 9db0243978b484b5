"""A PEP 517 build backend for palsdk, standard library only.

palsdk is one pure-Python package; building its wheel needs nothing but
zipfile, so `pip install ./sdk/python` works without fetching setuptools
(machines without access to a package index included).
"""

import base64
import hashlib
import os
import tarfile
import zipfile

NAME = "palsdk"
VERSION = "0.2.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = "py3-none-any"

METADATA = """Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: PAL's Python SDK: a client of its REST API, and durable sub-steps for process steps
Requires-Python: >=3.8
""".format(name=NAME, version=VERSION)

WHEEL = """Wheel-Version: 1.0
Generator: palsdk_build
Root-Is-Purelib: true
Tag: {tag}
""".format(tag=TAG)


def _files():
    pkg = os.path.join(HERE, NAME)
    for root, _, names in os.walk(pkg):
        for n in sorted(names):
            if n.endswith(".py"):
                full = os.path.join(root, n)
                yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "%s-%s.dist-info" % (NAME, VERSION)
    wheel = "%s-%s-%s.whl" % (NAME, VERSION, TAG)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc, data):
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        for full, arc in _files():
            with open(full, "rb") as f:
                add(arc, f.read())
        add(info + "/METADATA", METADATA.encode())
        add(info + "/WHEEL", WHEEL.encode())
        records.append(info + "/RECORD,,")
        z.writestr(info + "/RECORD", "\n".join(records) + "\n")
    return wheel


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, VERSION)
    sdist = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, sdist), "w:gz") as t:
        for n in ("pyproject.toml", "README.md", "_backend/palsdk_build.py"):
            t.add(os.path.join(HERE, n), arcname=base + "/" + n)
        for full, arc in _files():
            t.add(full, arcname=base + "/" + arc)
    return sdist
