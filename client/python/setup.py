"""Builds tiermem._tiermem (pybind11) against the libtiermem pkg-config finds.

setuptools does what it is made for here; the one thing it does not know is
where libtiermem is, which pkg-config says (an installed libtiermem-dev, or a
build tree's meson-uninstalled directory on PKG_CONFIG_PATH).
"""
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

from setuptools import Extension, setup

HERE = pathlib.Path(__file__).resolve().parent


def pkg_config(*args):
    for name in ("tiermem", "tiermem-uninstalled"):
        try:
            out = subprocess.run(["pkg-config", *args, name], check=True, capture_output=True, text=True).stdout
            return out.strip()
        except FileNotFoundError:
            sys.exit("tiermem: pkg-config is missing (Debian: apt install pkg-config)")
        except subprocess.CalledProcessError:
            continue
    sys.exit("tiermem: pkg-config finds no libtiermem: install libtiermem-dev (or `meson install` the "
             "repository), or set PKG_CONFIG_PATH to a build tree's meson-uninstalled directory")


def pybind11_include():
    try:
        import pybind11  # from PyPI when pip installs the build requirements
        return pybind11.get_include()
    except ImportError:
        if pathlib.Path("/usr/include/pybind11/pybind11.h").exists():
            return "/usr/include"  # Debian's pybind11-dev: headers only, any CPython
        sys.exit("tiermem: pybind11 is missing: pip install pybind11 (or apt install pybind11-dev)")


version = pkg_config("--modversion")
# The module takes TIERMEM_VERSION from tiermem_config.h, as in the Meson build.
config_dir = tempfile.mkdtemp(prefix="tiermem-py-")
pathlib.Path(config_dir, "tiermem_config.h").write_text(f'#pragma once\n#define TIERMEM_VERSION "{version}"\n')
cflags = shlex.split(pkg_config("--cflags"))
libs = shlex.split(pkg_config("--libs"))
lib_dirs = [f[2:] for f in libs if f.startswith("-L")]
sources = ["module.cpp", "errors.cpp", "buffers.cpp", "types.cpp", "client.cpp", "mapping.cpp", "batch.cpp"]

setup(
    version=version,
    ext_modules=[
        Extension(
            "tiermem._tiermem",
            sources=[os.path.join("tiermem", s) for s in sources],
            include_dirs=[config_dir, str(HERE / "tiermem"), pybind11_include()],
            extra_compile_args=[f for f in cflags if not f.startswith("-std=")] + ["-std=c++20", "-fvisibility=hidden"],
            libraries=[f[2:] for f in libs if f.startswith("-l")] + ["stdc++"],
            library_dirs=lib_dirs,
            runtime_library_dirs=lib_dirs,
            language="c++",
        )
    ],
)
