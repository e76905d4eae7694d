"""attnserve's Python client. Stubs are generated from the repository's proto/ at build time.

  /usr/bin/python3 -m pip install --no-build-isolation --no-deps --no-index client/python

Needs Debian's python3-grpcio, python3-grpc-tools (grpc_tools.protoc), python3-protobuf and
python3-numpy; attnserve.torch needs python3-torch.
"""
import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The repository's protos; a copy beside setup.py wins (for an sdist taken out of the tree).
PROTO_ROOT = next(p for p in (os.path.join(HERE, "proto"), os.path.join(HERE, "..", "..", "proto"))
                  if os.path.isdir(p))
PROTOS = ["attnserve/v1/attention.proto"]


def project_version():
    """The release: CMakeLists.txt's project(attnserve VERSION x.y.z), the one place it is set."""
    with open(os.path.join(HERE, "..", "..", "CMakeLists.txt")) as cmake:
        match = re.search(r"project\(attnserve VERSION ([0-9]+\.[0-9]+\.[0-9]+)", cmake.read())
    if match is None:
        raise RuntimeError("CMakeLists.txt has no project(attnserve VERSION x.y.z)")
    return match.group(1)


class BuildWithStubs(build_py):
    """build_py, plus attnserve/v1/attention_pb2{,_grpc}.py generated into the built package."""

    def run(self):
        super().run()
        from grpc_tools import protoc
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        for proto in PROTOS:
            code = protoc.main(["protoc", f"-I{PROTO_ROOT}", f"-I{include}",
                                f"--python_out={self.build_lib}",
                                f"--grpc_python_out={self.build_lib}", proto])
            if code != 0:
                raise RuntimeError(f"protoc failed on {proto}")
        open(os.path.join(self.build_lib, "attnserve", "v1", "__init__.py"), "a").close()


setup(
    name="attnserve",
    version=project_version(),
    description="Client for attnserve, a CPU multi-head attention gRPC service",
    packages=["attnserve", "attnserve.v1"],
    package_dir={"attnserve.v1": "attnserve/v1"},
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithStubs},
)
